"""Tokenize documents into memory-mapped token shards: see nvfp4train/data/prepare.py.

python scripts/prepare_data.py --config configs/data/bundled.yaml                 # all sources of a config
python scripts/prepare_data.py --input 'corpus/*.jsonl.gz' --out shards/web/train --tokenizer bpe8k --num-proc 8
python scripts/prepare_data.py --hf some/dataset --split train --out shards/x/train   # where a hub is reachable
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nvfp4train.data.prepare import main  # noqa: E402

if __name__ == "__main__":
    main()
