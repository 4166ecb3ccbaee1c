"""The committed corpus + tokenizer: small, three domains, and usable through the default config."""

import gzip
import json

import torch
from omegaconf import OmegaConf

from nvfp4train.data import build_train_loader, build_val_data
from nvfp4train.data.paths import REPO_ROOT

DOMAINS = ("literature", "encyclopedic", "code")


def test_bundle_is_small_real_and_split():
    files = list((REPO_ROOT / "data" / "bundled").glob("*.jsonl.gz")) + [REPO_ROOT / "data/tokenizer/bpe8k.json"]
    assert sum(f.stat().st_size for f in files) <= 5 * 1024 * 1024
    for domain in DOMAINS:
        ids = {}
        for split in ("train", "val"):
            with gzip.open(REPO_ROOT / "data" / "bundled" / f"{domain}.{split}.jsonl.gz", "rt") as f:
                docs = [json.loads(line) for line in f]
            assert docs and all(d["text"].strip() for d in docs)
            ids[split] = {d["id"].split("#")[0] for d in docs}  # the work a document comes from
        assert not ids["train"] & ids["val"], domain  # held-out works never in training
    readme = (REPO_ROOT / "data" / "README.md").read_text()
    for needle in ("CC BY-SA", "Wikipedia", "shakespeare", "PSF", "build_corpora.py"):
        assert needle in readme


def test_default_data_config_trains_and_validates():
    # As the trainer gets it: the Hydra group's node turned into a plain dict.
    cfg = OmegaConf.to_container(OmegaConf.load(REPO_ROOT / "configs" / "data" / "bundled.yaml"), resolve=True)
    loader = build_train_loader(
        cfg, seq_len=128, global_batch_size=8, micro_batch_size=4, rank=0, world_size=1, seed=0, total_samples=800
    )
    x, y = loader.next_microbatch()
    assert x.shape == (4, 128) and torch.equal(x[:, 1:], y[:, :-1])
    assert [p for p in cfg["phases"]][1]["start"] == 0.7 and cfg["phases"][2]["start"] == 0.9
    val = build_val_data(cfg, seq_len=128, max_sequences_per_domain=16)
    assert set(val) == set(DOMAINS) and all(v.shape == (16, 129) for v in val.values())


def test_corpus_builder_splits_by_work_and_cuts_at_paragraphs():
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_corpora", REPO_ROOT / "scripts" / "build_corpora.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    text = "\n\n".join(f"paragraph {i} " + "word " * 300 for i in range(200))
    docs = builder.split_long_text(text, max_chars=16_000)
    assert len(docs) > 1 and all(len(d) <= 16_000 for d in docs)
    assert "\n\n".join(docs) == text.strip()  # nothing lost or reordered
    works = [(f"work{i}", "x") for i in range(100)]
    train, val = builder.split_works(works)
    assert len(val) == 5 and not {w for w, _ in train} & {w for w, _ in val}
    assert builder.split_works(list(reversed(works)))[1] == val  # order-independent choice
