"""`--dataset text:DIR`: the user's own text (train/test .tsv, .csv or .jsonl) as token ids of the backbone's
tokenizer, trained like 20ng and r8; every bad folder or file is one line and exit code 2. On the tests' tiny BERT."""

import csv
import json
import random
from pathlib import Path

import pytest
import torch

from hetfl.cli import main
from hetfl.data import datasets, load_dataset, text
from hetfl.errors import HetflError
from hetfl.methods import config_from
from tinybert import tiny_bert, tiny_bert_dir  # noqa: F401  (fixtures)

pytest.importorskip("tokenizers")
L = 8  # tokens per document: [CLS], six words, [SEP]
TOPICS = {"energy": ["oil", "price", "ship"], "farm": ["grain", "wheat", "trade"],
          "finance": ["stock", "bank", "profit"]}
NOISE = ["the", "of", "and", "a", "to", "in", "said", "market", "rate", "loss"]  # in every class


def sentences(n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` (label, text) rows, the classes in turn: three words of the class's topic among three of noise."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = sorted(TOPICS)[i % len(TOPICS)]
        words = rng.choices(TOPICS[label], k=3) + rng.choices(NOISE, k=3)
        rng.shuffle(words)
        rows.append((label, " ".join(words)))
    return rows


def write(folder: Path, fmt: str, train, test, bom: bool = False) -> Path:
    """``folder`` holding train.FMT and test.FMT of the (label, text) rows, with an id column the reader ignores."""
    folder.mkdir(parents=True, exist_ok=True)
    for part, rows in (("train", train), ("test", test)):
        path = folder / f"{part}.{fmt}"
        with open(path, "w", encoding="utf-8-sig" if bom else "utf-8", newline="") as f:
            if fmt == "jsonl":
                f.writelines(json.dumps({"id": i, "label": lab, "text": t}) + "\n" for i, (lab, t) in enumerate(rows))
            else:
                w = csv.writer(f, delimiter="\t" if fmt == "tsv" else ",", lineterminator="\n")
                w.writerows([("id", "label", "text"), *((i, lab, t) for i, (lab, t) in enumerate(rows))])
    return folder


@pytest.fixture
def env(tiny_bert, tmp_path, monkeypatch):
    """The tiny BERT as backbone, a fresh token cache and a fresh per-process dataset cache."""
    monkeypatch.setenv("HETFL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(datasets, "_LOADED", {})
    return tmp_path


def test_a_tsv_folder_trains_through_the_cli_and_beats_chance(env, capsys):
    data = write(env / "data", "tsv", sentences(240, 0), sentences(60, 1))
    name = f"text:{data}"
    assert config_from({"dataset": name}).model == "minilm"  # text: the pretrained encoder by default
    code = main(["run", "--dataset", name, "--model", "minilm", "--max-length", str(L), "--levels", "2",
                 "--num-clients", "3", "--client-fraction", "1", "--rounds", "3", "--batch-size", "16", "--lr", "0.1",
                 "--out", str(env / "runs"), "--name", "mine", "--quiet"])
    assert code == 0, capsys.readouterr().err
    summary = json.loads((env / "runs" / "mine" / "summary.json").read_text())
    assert summary["dataset"] == name  # the name as given
    assert summary["final"]["global"]["ensemble"] > 0.8  # chance is 1/3; it reaches 1.0


def test_csv_and_jsonl_read_to_the_same_tensors_as_the_tsv_and_are_read_once(env, monkeypatch):
    train = [*sentences(30, 2), ("farm", 'wheat, "grain"\tand the\nrate')]  # quotes, a tab, a newline
    test = [*sentences(9, 3), ("energy", "oil")]
    base = load_dataset(f"text:{write(env / 'tsv', 'tsv', train, test)}", max_length=L)
    assert base.name == f"text:{env / 'tsv'}" and base.num_classes == 3 and base.input_shape == (L,)
    assert base.y_train[-1] == 1 and base.x_test.dtype == torch.long  # classes in sorted order: farm is 1
    for fmt, bom in (("csv", True), ("jsonl", False), ("tsv", True)):  # a UTF-8 BOM is accepted
        other = load_dataset(f"text:{write(env / f'{fmt}-{bom}', fmt, train, test, bom)}", max_length=L)
        for a, b in zip((base.x_train, base.y_train, base.x_test, base.y_test),
                        (other.x_train, other.y_train, other.x_test, other.y_test)):
            assert torch.equal(a, b), fmt
    assert load_dataset(f"text:{env / 'tsv'}", max_length=L) is base  # read once per process
    monkeypatch.setattr(datasets, "_LOADED", {})  # a new process: the token cache, not the tokenizer
    monkeypatch.setattr(text, "tokenize", lambda *a: pytest.fail("tokenized again instead of reading the cache"))
    assert torch.equal(load_dataset(f"text:{env / 'tsv'}", max_length=L).x_train, base.x_train)


def test_numbers_are_labels_and_long_fields_are_read(env, request):
    limit = csv.field_size_limit(131072)  # the csv module's default, which a 200 kB document exceeds
    request.addfinalizer(lambda: csv.field_size_limit(limit))
    folder = env / "data"
    folder.mkdir()
    rows = [{"label": 10, "text": "oil " * 50_000}, {"label": 9, "text": "wheat"}, {"label": "9", "text": "grain"}]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "test.jsonl").write_text(json.dumps({"label": 10.0, "text": "oil"}) + "\n")
    with pytest.raises(HetflError, match="no training document has.*'10.0'"):  # 10.0 is not the label 10
        load_dataset(f"text:{folder}", max_length=L)
    (folder / "test.jsonl").write_text(json.dumps({"label": 10, "text": "oil"}) + "\n")
    data = load_dataset(f"text:{folder}", max_length=L)
    assert data.y_train.tolist() == [0, 1, 1] and data.y_test.tolist() == [0]  # "10" < "9": sorted as strings
    table = env / "table"
    table.mkdir()
    (table / "train.csv").write_text("text,label\n" + "oil " * 50_000 + ",a\nwheat,b\n")  # columns in any order
    (table / "test.csv").write_text("label,text\na,oil\n")
    long = load_dataset(f"text:{table}", max_length=L)
    assert torch.equal(long.x_train, data.x_train[:2]) and long.y_train.tolist() == [0, 1]


GOOD = "label\ttext\nenergy\toil price\nfarm\twheat grain\n"


def bad_folders(tmp: Path) -> dict[str, tuple[Path | None, str]]:
    """Each bad case: the DIR of text:DIR and a fragment of its one-line error."""
    def folder(name: str, **files: str | bytes) -> Path:
        d = tmp / name
        d.mkdir()
        for f, content in files.items():
            path = d / f.replace("_", ".")
            path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
        return d

    (tmp / "a-file").write_text(GOOD)
    utf8 = GOOD.encode() + b"farm\tgr\xffain\n"
    return {
        "missing": (tmp / "nowhere", "folder '" + str(tmp / "nowhere") + "' does not exist"),
        "a file": (tmp / "a-file", "is not a folder"),
        "no files": (folder("empty"), "holds no train.tsv and test.tsv, train.csv and test.csv, or train.jsonl"),
        "no test file": (folder("half", train_tsv=GOOD), "has no test.tsv"),
        "tsv and csv": (folder("both", train_tsv=GOOD, test_tsv=GOOD, test_csv="label,text\n"),
                        "holds files of several formats (tsv, csv)"),
        "no text column": (folder("cols", train_tsv="label\tbody\na\tb\n", test_tsv=GOOD),
                           "train.tsv: the header row has no column text; it needs label and text, found "
                           "['label', 'body']"),
        "no label column": (folder("cols2", train_csv="id,Label,text\n", test_csv="label,text\n"),
                            "no column label; it needs label and text, found ['id', 'Label', 'text']"),
        "empty text": (folder("blank", train_tsv=GOOD + "farm\t  \n", test_tsv=GOOD),
                       "train.tsv, line 4: the text is empty"),
        "empty label": (folder("nolabel", train_tsv=GOOD, test_tsv=GOOD + "\toil\n"),
                        "test.tsv, line 4: the label is empty"),
        "stray field": (folder("tabs", train_tsv=GOOD + "farm\twheat\tgrain\n", test_tsv=GOOD),
                        "train.tsv, line 4: 3 fields where the header row has 2"),
        "label only in test": (folder("unseen", train_tsv=GOOD, test_tsv=GOOD + "zebra\toil\n"),
                               "test.tsv has labels that no training document has, which no model can learn: "
                               "['zebra']"),
        "one class": (folder("one", train_tsv="label\ttext\na\toil\na\tgrain\n", test_tsv="label\ttext\na\toil\n"),
                      "train.tsv: the labels hold one class ('a'); classification needs at least 2"),
        "empty test set": (folder("notest", train_tsv=GOOD, test_tsv="label\ttext\n"),
                           "test.tsv holds no rows; the train and test files each need at least one"),
        "empty file": (folder("nothing", train_tsv=GOOD, test_tsv=""), "test.tsv is empty"),
        "not utf-8": (folder("latin", train_tsv=utf8, test_tsv=GOOD),  # the byte of \xff in "farm\tgr\xffain"
                      f"train.tsv is not UTF-8 text (byte {len(GOOD) + 7})"),
        "bad json": (folder("json", train_jsonl='{"label": "a", "text": "oil"}\n{"label": "b", "text": oil}\n',
                            test_jsonl='{"label": "a", "text": "oil"}\n'), "train.jsonl, line 2: not valid JSON"),
        "json keys": (folder("keys", train_jsonl='{"label": "a", "txt": "oil"}\n', test_jsonl=""),
                      "train.jsonl, line 1: no key text; found keys ['label', 'txt']"),
        "unclosed quote": (folder("quote", train_csv='label,text\na,"oil\n', test_csv="label,text\na,oil\n"),
                           "train.csv, line 2: unexpected end of data"),
        "stray quote": (folder("quote2", train_csv='label,text\na,oil\nb,"oil" and\n', test_csv="label,text\na,oil\n"),
                        "train.csv, line 3: ',' expected after '\"'"),
        "no folder named": (None, "text:DIR needs a folder"),  # --dataset text:
    }


@pytest.mark.parametrize("case", ["missing", "a file", "no files", "no test file", "tsv and csv", "no text column",
                                  "no label column", "empty text", "empty label", "stray field", "label only in test",
                                  "one class", "empty test set", "empty file", "not utf-8", "bad json", "json keys",
                                  "unclosed quote", "stray quote", "no folder named"])
def test_a_bad_folder_or_file_is_one_line_and_exit_2_with_no_run_folder(env, capsys, case):
    (env / "bad").mkdir()
    folder, fragment = bad_folders(env / "bad")[case]
    out = env / "runs"
    code = main(["run", "--dataset", f"text:{folder or ''}", "--max-length", str(L), "--out", str(out), "--quiet"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("hetfl: error:"), lines
    assert fragment in lines[0], lines[0]
    assert not out.exists() or not any(out.iterdir())
