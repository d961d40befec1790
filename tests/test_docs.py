"""The README and docs/ hold together: every relative link or image names a file or folder of the repository,
every #anchor names a heading of its target (by GitHub's slug rule), the README stays a front page (under 200
lines) and lists every file of docs/. No network: links to http:, https: and mailto: are not followed."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_MAX_LINES = 200
EXTERNAL = ("http:", "https:", "mailto:")


def markdown_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


# --- reading Markdown -----------------------------------------------------------------------------

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
HTML_ANCHOR = re.compile(r"<a\s[^>]*\b(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.IGNORECASE)
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)((?:(?!\n[ \t]*\n).)+?)(?<!`)\1(?!`)", re.DOTALL)
# [text](target "title"): the text may hold one level of brackets; the target has no spaces unless in <...>
TARGET = r"\(\s*(<[^<>\n]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^()]*\)))?\s*\)"
IMAGE = re.compile(r"!\[[^\[\]]*\]" + TARGET)
LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\[\]]*\])*\]" + TARGET)
DEFINITION = re.compile(r"^ {0,3}\[[^\[\]]+\]:[ \t]*(<[^<>\n]*>|\S+)", re.MULTILINE)


def outside_fences(text: str) -> list[str]:
    """The file's lines with every line of a fenced code block (its fences included) blanked."""
    lines, fence = text.split("\n"), None
    kept = []
    for line in lines:
        opened = FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)
            kept.append("")
        elif fence is not None:
            closing = FENCE.match(line)
            if (
                closing
                and closing.group(1)[0] == fence[0]
                and len(closing.group(1)) >= len(fence)
                and (line.strip() == closing.group(1))
            ):
                fence = None
            kept.append("")
        else:
            kept.append(line)
    return kept


def github_slug(text: str) -> str:
    """A heading's anchor as GitHub makes it: the text as rendered, lowercased, every character but letters,
    marks, numbers, connector punctuation (the underscore), hyphens and spaces removed, each space a hyphen."""
    slug = []
    for char in text.strip().lower():
        if char in " -" or unicodedata.category(char)[0] in "LMN" or unicodedata.category(char) == "Pc":
            slug.append("-" if char == " " else char)
    return "".join(slug)


def heading_text(raw: str) -> str:
    """A heading's words as GitHub renders them: code spans kept as written, links and images as their text,
    HTML tags and emphasis markers dropped."""
    parts = re.split(r"(`+[^`]*`+)", raw)
    words = []
    for index, part in enumerate(parts):
        if index % 2:  # a code span: its content, as is
            words.append(part.strip("`"))
            continue
        part = re.sub(r"!?\[([^\[\]]*)\]\([^()]*\)", r"\1", part)
        part = re.sub(r"<[^>]+>", "", part)
        part = part.replace("*", "")
        part = re.sub(r"(?<!\w)_+|_+(?!\w)", "", part)  # _emphasis_; snake_case words keep theirs
        words.append(part)
    return "".join(words)


def anchors(path: Path) -> list[str]:
    """The anchors of a Markdown file's headings in order, with GitHub's -1, -2 ... for repeated ones,
    and the ids of its HTML anchors."""
    lines = outside_fences(path.read_text())
    slugs: list[str] = []
    seen: dict[str, int] = {}

    def add(title: str) -> None:
        base = result = github_slug(heading_text(title))
        while result in seen:  # as github-slugger does
            seen[base] += 1
            result = f"{base}-{seen[base]}"
        seen[result] = 0
        slugs.append(result)

    previous = ""
    for line in lines:
        atx = ATX.match(line)
        if atx:
            add(re.sub(r"(?:^|[ \t]+)#+$", "", atx.group(2) or ""))
        elif (
            SETEXT.match(line)
            and previous.strip()
            and not ATX.match(previous)
            and not previous.lstrip().startswith(("|", "-", "*", "+", ">"))
        ):
            add(previous.strip())
        slugs.extend(HTML_ANCHOR.findall(line))
        previous = line
    return slugs


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link, image and link definition outside code."""
    text = "\n".join(outside_fences(path.read_text()))
    text = CODE_SPAN.sub(lambda span: re.sub(r"[^\n]", " ", span.group(0)), text)
    found = []
    for pattern in (IMAGE, LINK, DEFINITION):
        found += [(match.start(), match.group(1)) for match in pattern.finditer(text)]
        if pattern is IMAGE:  # an image inside a link's text: the link is read with the image blanked
            text = IMAGE.sub(lambda image: re.sub(r"[^\n]", " ", image.group(0)), text)
    return [(text.count("\n", 0, offset) + 1, target) for offset, target in sorted(found)]


# --- checking -------------------------------------------------------------------------------------


def problems(path: Path, root: Path = ROOT) -> list[str]:
    """Every broken relative link of one Markdown file, each as 'file:line: link 'target': what is wrong'."""
    found = []
    root, path = root.resolve(), path.resolve()
    shown = path.relative_to(root)
    for line, target in links(path):
        where = f"{shown}:{line}: link '{target}'"
        target = target.strip("<>")
        if target.lower().startswith(EXTERNAL):
            continue
        address, _, anchor = target.partition("#")
        address = unquote(address)
        if not address and not anchor:
            found.append(f"{where}: empty target")
            continue
        aimed = (root / address.lstrip("/")) if address.startswith("/") else (path.parent / address)
        aimed = aimed.resolve() if address else path
        if address and not aimed.is_relative_to(root):
            found.append(f"{where}: points outside the repository ({aimed})")
            continue
        if not aimed.exists():
            found.append(f"{where}: no such file or folder {aimed.relative_to(root)}")
            continue
        if not anchor:
            continue
        if aimed.is_dir() or aimed.suffix.lower() != ".md":
            found.append(f"{where}: the anchor #{anchor} points into {aimed.name}, which is not a Markdown file")
            continue
        known = anchors(aimed)
        if unquote(anchor) not in known:
            found.append(
                f"{where}: no heading of {aimed.relative_to(root)} has the anchor #{anchor} "
                f"(its anchors: {', '.join(known) or 'none'})"
            )
    return found


@pytest.mark.parametrize("path", markdown_files(), ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_names_a_file_and_a_heading_that_exist(path):
    broken = problems(path)
    assert not broken, f"{len(broken)} broken link(s) in {path.relative_to(ROOT)}:\n" + "\n".join(broken)


def test_the_readme_is_a_front_page():
    count = README.read_text().count("\n")
    assert count < README_MAX_LINES, (
        f"README.md has {count} lines, {README_MAX_LINES} at most: move the detail to a file under docs/ "
        'and link it from the README\'s "Where to read next"'
    )


def test_the_readme_links_every_file_under_docs():
    linked = {(README.parent / unquote(target.partition("#")[0])).resolve() for _, target in links(README)}
    missing = [str(doc.relative_to(ROOT)) for doc in markdown_files()[1:] if doc.resolve() not in linked]
    assert not missing, f'README.md links none of {", ".join(missing)}: add each to "Where to read next"'


# --- the checker itself ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("Logs, metrics and the operations page", "logs-metrics-and-the-operations-page"),
        (
            "The offline demo model's words for your tools (optional)",
            "the-offline-demo-models-words-for-your-tools-optional",
        ),
        ("Trying it: a five-minute tour", "trying-it-a-five-minute-tour"),
        ("`webapp/__init__.py` and _emphasis_ and **bold**", "webapp__init__py-and-emphasis-and-bold"),
        ("Decision → tool move", "decision--tool-move"),
        ("A [linked](other.md) word", "a-linked-word"),
        ("Ünïcode stays, punctuation (like this!) goes", "ünïcode-stays-punctuation-like-this-goes"),
    ],
)
def test_slugs_follow_githubs_rule(heading, slug):
    assert github_slug(heading_text(heading)) == slug


def _repo(tmp_path: Path, readme: str, doc: str) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(readme)
    (tmp_path / "docs" / "guide.md").write_text(doc)
    return tmp_path


GUIDE = """# Guide

## Setup

```sh
# Not a heading
[not a link](missing.md)
```

## Setup

## Setup-1

<a id="custom"></a>
"""


def test_repeated_headings_get_numbered_anchors_and_fenced_lines_are_ignored(tmp_path):
    root = _repo(tmp_path, "# Read me\n", GUIDE)
    assert anchors(root / "docs" / "guide.md") == ["guide", "setup", "setup-1", "setup-1-1", "custom"]
    assert links(root / "docs" / "guide.md") == []


def test_the_checker_names_the_file_the_link_and_what_is_wrong(tmp_path):
    readme = """# Read me

See [the guide](docs/guide.md#setup-1), [again](docs/guide.md#custom), [a folder](docs/),
[the web](https://example.com/x#y), [mail](mailto:a@b.c), ![a picture](docs/guide.md) and `[code](nowhere.md)`.

A [missing file](docs/missing.md), a [missing heading](docs/guide.md#install),
an [anchor into a folder](docs/#setup), [outside](../elsewhere.md), a [missing heading here](#nowhere)
and [its own title](#read-me).

[ref]: docs/gone.md
"""
    root = _repo(tmp_path, readme, GUIDE)
    outside = (tmp_path.parent / "elsewhere.md").resolve()
    assert problems(root / "README.md", root) == [
        "README.md:6: link 'docs/missing.md': no such file or folder docs/missing.md",
        "README.md:6: link 'docs/guide.md#install': no heading of docs/guide.md has the anchor #install "
        "(its anchors: guide, setup, setup-1, setup-1-1, custom)",
        "README.md:7: link 'docs/#setup': the anchor #setup points into docs, which is not a Markdown file",
        f"README.md:7: link '../elsewhere.md': points outside the repository ({outside})",
        "README.md:7: link '#nowhere': no heading of README.md has the anchor #nowhere (its anchors: read-me)",
        "README.md:10: link 'docs/gone.md': no such file or folder docs/gone.md",
    ]
