import torch

from speclab.kernels.util.digest import weights_sha256
from speclab.sweeps.results import weights_sha256 as results_sha256


def test_digest_sees_every_byte_name_and_dtype_but_not_insertion_order():
    sd = {"b": torch.randn(3, 4), "a": torch.arange(5), "h": torch.ones(2, dtype=torch.bfloat16)}
    before = weights_sha256(sd)
    assert weights_sha256(dict(reversed(list(sd.items())))) == before == results_sha256(sd)
    sd["b"][0, 0] += 1
    assert weights_sha256(sd) != before
    renamed = {("c" if k == "a" else k): v for k, v in sd.items()}
    assert weights_sha256(renamed) != weights_sha256(sd)
    recast = {**sd, "h": sd["h"].to(torch.float16)}  # same values, other dtype
    assert weights_sha256(recast) != weights_sha256(sd)
