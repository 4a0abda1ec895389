"""The README's commands are the ones CI runs and the scripts accept; the documents' links
resolve."""
import re
from urllib.parse import unquote

from conftest import REPO


def readme_commands():
    return re.findall(r"```(?:bash|sh)\n(.*?)\n```", (REPO / "README.md").read_text(), re.S)


def test_ci_runs_the_readme_test_command():
    ci_command = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci_command in readme_commands()


def test_readme_run_command_is_the_main_job():
    assert "pip install -r requirements.txt && python scripts/run_local.py" in readme_commands()


# Markdown links and images: [text](target) and ![alt](target), target optionally
# in <...> and with a title.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")


def documents():
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def prose(text):
    """The text outside fenced code blocks and inline code, where a link is a link."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(document):
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as '-', repeats
    numbered."""
    seen, found = {}, set()
    for heading in re.findall(r"^#+\s+(.*?)\s*#*$", prose(document.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def test_every_relative_link_in_the_documents_resolves():
    """Every relative link in README.md and docs/*.md names a file (or folder) of the repository,
    and a heading that exists when it has an anchor: sections move between documents, links must
    follow."""
    broken = []
    for document in documents():
        for target in LINK.findall(prose(document.read_text())):
            target = target.strip("<>")
            if re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            resolved = (document.parent / unquote(path)).resolve() if path else document
            where = f"{document.relative_to(REPO)}: {target}"
            if not resolved.is_relative_to(REPO) or not resolved.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{where} (no such heading)")
    assert not broken, "\n".join(broken)


# A repository path written out in a document or a description:
# `mnist_dp/privacy/ledger.py`, `scripts/run_local.py`.
PATH = re.compile(
    r"(?<![\w/.-])((?:mnist_dp|assets|scripts|benchmarks|tests|docs|examples)/[\w/.-]*\w\.(?:py|md|json))\b")


def test_every_repository_path_the_documents_name_exists():
    """Modules move between packages: a path a document names must follow (README, docs/, the
    assets' description.md files)."""
    named = [*documents(), *sorted((REPO / "assets").glob("*/description.md"))]
    missing = [f"{document.relative_to(REPO)}: {path}" for document in named
               for path in PATH.findall(document.read_text()) if not (REPO / path).exists()]
    assert not missing, "\n".join(missing)


def test_the_readme_table_is_the_one_the_default_run_prints():
    from mnist_dp.report import display
    from mnist_dp.report.results import Record

    records = [Record(run=f, round=1, organization="MyOrg1MSP", framework=f, dp=True, epsilon=2.999,
                      epsilon_rdp=3.271, epsilon_by_organization={"MyOrg1MSP": 2.999}, delta=1e-5,
                      accountant="PLD (Google dp_accounting)", noise_multiplier=2.866,
                      sample_rate=0.125, steps=240, test_accuracy=0.96,
                      data_epsilon_by_organization={"MyOrg1MSP": 5.549})
               for f in ("torch", "tf", "mindspore")]
    section = (REPO / "README.md").read_text().split("## What the default run prints and draws")[1]
    printed = re.search(r"```\n(.*?)\n```", section, re.S).group(1).splitlines()
    headers, rows = display._rows(records)
    assert re.split(r"\s{2,}", printed[0].strip()) == headers  # the columns, in the order printed
    assert [re.split(r"\s{2,}", line.strip())[:2]
            for line in printed[2:]] == [row[:2] for row in rows]


def test_every_documented_command_is_run_by_a_test_or_says_why_not():
    """A command in a ```bash block of the README or docs/ is run as written on tiny data by a test
    (run_documented) or named in documented.NOT_RUN with the reason; a NOT_RUN entry names a
    command that exists."""
    import documented

    calls = re.findall(r"run_documented\(\s*\"([^\"]+)\",\s*((?:\"[^\"]*\"\s*)+),",
                       "".join(p.read_text() for p in (REPO / "tests").rglob("test_*.py")))
    run = {(document, command) for document, prefix in calls for command in documented.journey(
        document, "".join(re.findall(r'"([^"]*)"', prefix)))}
    unaccounted = [f"{document}: {command}" for document, command in documented.commands()
                   if (document, command) not in run and not documented.not_run(document, command)]
    assert not unaccounted, "\n".join(unaccounted)
    stale = [key for key in documented.NOT_RUN if not any(
        d == key[0] and c.startswith(key[1]) for d, c in documented.commands())]
    assert not stale, stale
