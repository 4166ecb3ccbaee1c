"""Result processing for evals/lm_eval/humaneval_solutions.yaml (lm-eval loads it by `!function`)."""


def bits_per_byte_results(doc, results):
    """(log-likelihood of the target, its UTF-8 bytes): lm-eval's bits_per_byte aggregation turns these into
    -sum(ll) / sum(bytes) / ln 2, nvfp4train.eval's bits_per_byte of a `loss` task."""
    loglikelihood, _ = results[0]
    return {"bits_per_byte": (loglikelihood, len(doc["target"].encode("utf-8")))}
