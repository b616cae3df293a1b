"""The analytic model of SD and PSD step time (DESIGN.md section 3)."""


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens per verification round with per-token acceptance rate alpha and k drafts."""
    return float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def psd_speedup(verify_s: float, draft_s: float) -> float:
    """PSD over sequential SD when costs are linear in batch size: (V + t) / max(V, t), V and t
    being one sub-batch's verify and draft times."""
    return (verify_s + draft_s) / max(verify_s, draft_s)


def psd_speedup_equal_concurrency(sd_verify_s: float, sd_draft_s: float, psd_verify_s: float,
                                  psd_draft_s: float) -> float:
    """PSD over SD with the same requests in flight: SD takes V(2b) + t(2b) per round for the whole
    batch, PSD max(V(b), t(b)) per sub-batch, two sub-batches per round."""
    return (sd_verify_s + sd_draft_s) / (2 * max(psd_verify_s, psd_draft_s))
