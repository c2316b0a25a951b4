"""The paper's experiments, built on the method: RouteSim (`routesim.py`, `launch.reproduce` and `launch.evaluate`)
and the MINT logs (`mint.py`, `launch.mint`), sharing one run layout and seed loop (`common.py`) and one report
writer (`report.py`)."""
