"""Coarse-stage inference time and FLOPs of POPT, the MLP and HI benchmarks (Table II).

Single-snapshot (batch 1) and batched inference, all in one run so the ratios are side
by side. Latency does not depend on the trained weights, so freshly initialized
networks of the paper's sizes are timed. POPT's FLOPs: eq. (29) and XLA's count of the
compiled network; MLP and HI: the dense-layer count and the paper's formulas. The
"matmul floor" rows time the encoder's dense products alone (no softmax, LayerNorm,
GELU or head): no float32 implementation of the network is faster on the device.

If PyTorch is installed, an equivalent PyTorch POPT (same architecture, the JAX
weights copied in, outputs checked to agree) is timed in the same run: the paper's
timings were PyTorch on CPU. Otherwise it says so and skips it.

    python benchmarks/popt_latency.py --json out/popt_latency.json
    python benchmarks/popt_latency.py --quick      # fewer repeats
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import time

import jax

jax.config.update("jax_enable_x64", True)  # physics in float64; the networks stay float32

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import device_name, print_table, write_json  # noqa: E402
from flax import nnx  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import complexity  # noqa: E402
from dmimo_jax.estimators import hyperbola  # noqa: E402
from dmimo_jax.learning.hi import AmbiguityClassifier, HIEstimator  # noqa: E402
from dmimo_jax.learning.mlp import MLPConfig, MLPRegressor  # noqa: E402
from dmimo_jax.learning.nets import functional, inference_fn  # noqa: E402
from dmimo_jax.learning.popt import POPT, POPTConfig  # noqa: E402


def _time(fn, repeats):
    fn()  # compile / warm up
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def _interleaved_ratio(fn, floor, rounds, calls):
    """Per-round ratio of ``fn``'s median time to ``floor``'s, the two alternating.

    Rounds of ``calls`` calls each, ``fn`` then ``floor``: both see the machine in the same
    state, so the ratio is steadier than two timings taken one after the other.
    """
    ratios = []
    for _ in range(rounds):
        t_fn = statistics.median(_time(fn, calls))
        t_floor = statistics.median(_time(floor, calls))
        ratios.append(t_fn / t_floor)
    return ratios


def _row(method, framework, batch, times, flops_formula, flops_xla, **extra):
    ms = [1e3 * t / batch for t in times]  # per snapshot
    return dict(
        method=method,
        framework=framework,
        batch=batch,
        ms_median=statistics.median(ms),
        ms_mean=statistics.fmean(ms),
        ms_std=statistics.stdev(ms) if len(ms) > 1 else 0.0,
        repeats=len(ms),
        flops_formula=flops_formula,
        flops_xla=flops_xla,
        device=device_name() if framework == "jax" else "cpu",
        **extra,
    )


def torch_popt(net: POPT):
    """A PyTorch module with POPT's architecture and ``net``'s weights (or None)."""
    try:
        import torch
        from torch import nn
    except ImportError:
        return None
    cfg = net.config
    d = cfg.d_emb
    t = lambda a: torch.tensor(np.asarray(a, np.float32))

    class Block(nn.Module):
        def __init__(self, blk):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-6), nn.LayerNorm(d, eps=1e-6)
            self.attn = nn.MultiheadAttention(d, cfg.n_head, batch_first=True)
            self.ff1, self.ff2 = nn.Linear(d, cfg.d_ff), nn.Linear(cfg.d_ff, d)
            with torch.no_grad():
                for ln, src in ((self.ln1, blk.ln1), (self.ln2, blk.ln2)):
                    ln.weight.copy_(t(src.scale[...]))
                    ln.bias.copy_(t(src.bias[...]))
                a = blk.attn
                w = [
                    t(np.asarray(p.kernel[...]).reshape(d, d)).T for p in (a.query, a.key, a.value)
                ]
                b = [t(np.asarray(p.bias[...]).reshape(d)) for p in (a.query, a.key, a.value)]
                self.attn.in_proj_weight.copy_(torch.cat(w))
                self.attn.in_proj_bias.copy_(torch.cat(b))
                self.attn.out_proj.weight.copy_(t(np.asarray(a.out.kernel[...]).reshape(d, d)).T)
                self.attn.out_proj.bias.copy_(t(a.out.bias[...]))
                for lin, src in ((self.ff1, blk.ff1), (self.ff2, blk.ff2)):
                    lin.weight.copy_(t(src.kernel[...]).T)
                    lin.bias.copy_(t(src.bias[...]))

        def forward(self, h):
            y = self.ln1(h)
            h = h + self.attn(y, y, y, need_weights=False)[0]
            return h + self.ff2(nn.functional.gelu(self.ff1(self.ln2(h))))

    class TorchPOPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.project = nn.Linear(2, d, bias=False)
            self.ap = nn.Parameter(t(net.ap_embedding[...]))
            self.blocks = nn.ModuleList([Block(b) for b in net.blocks])
            self.ln_out, self.ln_head = nn.LayerNorm(d, eps=1e-6), nn.LayerNorm(d, eps=1e-6)
            self.head1, self.head2 = nn.Linear(d, cfg.d_h), nn.Linear(cfg.d_h, 3)
            s = net.standardizer
            self.register_buffer("mean", t(s.mean[...]))
            self.register_buffer("scale", t(s.scale[...]))
            with torch.no_grad():
                self.project.weight.copy_(t(net.project.kernel[...]).T)
                for ln, src in ((self.ln_out, net.ln_out), (self.ln_head, net.ln_head)):
                    ln.weight.copy_(t(src.scale[...]))
                    ln.bias.copy_(t(src.bias[...]))
                for lin, src in ((self.head1, net.head1), (self.head2, net.head2)):
                    lin.weight.copy_(t(src.kernel[...]).T)
                    lin.bias.copy_(t(src.bias[...]))

        def forward(self, r):
            if cfg.reference is not None:
                r = r - r[..., cfg.reference : cfg.reference + 1]
            h = self.project(torch.stack([torch.sin(r), torch.cos(r)], -1)) + self.ap
            for blk in self.blocks:
                h = blk(h)
            g = self.ln_out(h).mean(-2)
            z = self.head2(nn.functional.gelu(self.head1(self.ln_head(g))))
            return z * self.scale + self.mean

    return TorchPOPT().eval()


def matmul_floor(net: POPT):
    """The dense products of POPT's encoder alone (fused QKV, output, D_ff MLP), jitted.

    No attention softmax, LayerNorm, GELU or head: a lower bound on the time of any
    float32 implementation of the network on this device at the same batch.
    """
    cfg, m = net.config, net.num_aps
    d = cfg.d_emb
    keys = jax.random.split(jax.random.key(0), 4)
    shapes = ((d, 3 * d), (d, d), (d, cfg.d_ff), (cfg.d_ff, d))
    wqkv, wo, w1, w2 = (
        jax.random.normal(k, s, jnp.float32) / d for k, s in zip(keys, shapes, strict=True)
    )

    @jax.jit
    def floor(r):
        h = jnp.broadcast_to(r[..., None], (*r.shape, d))
        for _ in range(cfg.n_enc):
            h = h + (h @ wqkv)[..., :d] @ wo
            h = h + (h @ w1) @ w2
        return h[..., 0, :3]

    flops = 2 * m * cfg.n_enc * (3 * d * d + d * d + 2 * d * cfg.d_ff)
    return floor, flops


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=1280, help="timed single-snapshot runs")
    ap.add_argument("--batch", type=int, default=1280)
    ap.add_argument(
        "--rounds", type=int, default=8, help="interleaved network/floor rounds at batch 1"
    )
    ap.add_argument("--quick", action="store_true", help="100 repeats, batch 256, 4 rounds")
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.repeats, args.batch, args.rounds = 100, 256, 4
    batch_repeats = max(5, args.repeats // 64)

    scene = dj.paper_scene()
    m = scene.num_aps
    low, high = scene.ue_low, scene.ue_high
    rng = np.random.default_rng(0)
    r1 = jnp.asarray(rng.uniform(-np.pi, np.pi, (1, m)), jnp.float32)
    rb = jnp.asarray(rng.uniform(-np.pi, np.pi, (args.batch, m)), jnp.float32)
    rows = []

    # ---- POPT: the paper's configuration, and the `cpu` training preset's smaller network
    ratios, floor_ratios = [], []
    for name, cfg in (("POPT", POPTConfig.paper()), ("POPT cpu-preset", POPTConfig.cpu())):
        net = POPT(m, cfg, low=low, high=high, rngs=nnx.Rngs(0))
        apply, state = functional(net)
        f = inference_fn(net)  # jitted, weights as constants
        f_formula = complexity.popt_flops(m, cfg)
        f_xla = complexity.network_flops_xla(apply, state, m)
        jax_rows = []
        for r, reps in ((r1, args.repeats), (rb, batch_repeats)):
            times = _time(lambda r=r, f=f: f(r).block_until_ready(), reps)
            jax_rows.append(_row(name, "jax", r.shape[0], times, f_formula, f_xla))
        rows += jax_rows
        floor, floor_flops = matmul_floor(net)
        for r, reps in ((r1, args.repeats), (rb, batch_repeats)):
            times = _time(lambda r=r, f=floor: f(r).block_until_ready(), reps)
            rows.append(_row(f"{name} matmul floor", "jax", r.shape[0], times, floor_flops, None))
        round_ratios = _interleaved_ratio(
            lambda f=f: f(r1).block_until_ready(),
            lambda f=floor: f(r1).block_until_ready(),
            args.rounds,
            max(5, args.repeats // args.rounds),
        )
        jax_rows[0].update(
            floor_ratio_rounds=round_ratios, floor_ratio_median=statistics.median(round_ratios)
        )
        floor_ratios.append((name, round_ratios))
        tnet = torch_popt(net)
        if tnet is None:
            print("PyTorch is not installed: skipping the PyTorch POPT comparison")
            continue
        import torch

        with torch.inference_mode():
            out_t = tnet(torch.tensor(np.asarray(rb[:64]))).numpy()
        diff = float(np.max(np.abs(out_t - np.asarray(f(rb[:64])))))
        print(f"{name}: PyTorch vs JAX with the same weights: max |diff| = {diff:.2e} m")
        for r, reps, jr in ((r1, args.repeats, jax_rows[0]), (rb, batch_repeats, jax_rows[1])):
            rt = torch.tensor(np.asarray(r))

            def run(rt=rt, tnet=tnet):
                with torch.inference_mode():
                    return tnet(rt)

            row = _row(
                name,
                f"torch {torch.__version__} (eager)",
                r.shape[0],
                _time(run, reps),
                f_formula,
                None,
                agree_m=diff,
            )
            rows.append(row)
            ratios.append((name, r.shape[0], row["ms_median"] / jr["ms_median"]))

    # ---- MLP benchmark
    mcfg = MLPConfig()
    mlp = MLPRegressor(m, mcfg, low=low, high=high, rngs=nnx.Rngs(0))
    apply_m, state_m = functional(mlp)
    g = inference_fn(mlp)
    widths = [2 * (m - 1), *mcfg.hidden, 3]
    for r, reps in ((r1, args.repeats), (rb, batch_repeats)):
        times = _time(lambda r=r: g(r).block_until_ready(), reps)
        rows.append(
            _row(
                "MLP",
                "jax",
                r.shape[0],
                times,
                complexity.mlp_flops(widths),
                complexity.network_flops_xla(apply_m, state_m, m),
                flops_paper=complexity.MLP_FLOPS_PAPER,
            )
        )

    # ---- HI benchmark: ambiguity classifier + hyperboloid intersection (float64)
    lam = float(scene.wavelength)
    n_max = hyperbola.max_ambiguity(scene.ap_positions, lam)
    clf = AmbiguityClassifier(
        m, mcfg, ap_positions=scene.ap_positions, wavelength=lam, n_max=n_max, rngs=nnx.Rngs(0)
    )
    hi = HIEstimator(clf, scene)
    q = (m - 1) * clf.num_classes
    widths_hi = [2 * (m - 1), *mcfg.hidden, q]
    apply_c, state_c = functional(clf)
    hi_jit = jax.jit(lambda r: hi(r))
    for r, reps in ((r1, args.repeats), (rb, batch_repeats)):
        r64 = r.astype(jnp.float64)
        times = _time(lambda r64=r64: hi_jit(r64).block_until_ready(), reps)
        rows.append(
            _row(
                "HI",
                "jax",
                r.shape[0],
                times,
                complexity.mlp_flops(widths_hi),
                complexity.network_flops_xla(apply_c, state_c, m),
                flops_paper=complexity.hi_flops_paper(m, q),
                num_classes=q,
            )
        )

    cols = [
        ("method", "method", "s"),
        ("framework", "framework", "s"),
        ("batch", "batch", "d"),
        ("ms_median", "ms/snap med", ".4f"),
        ("ms_mean", "ms/snap mean", ".4f"),
        ("ms_std", "ms std", ".4f"),
        ("flops_formula", "FLOPs formula", ".3e"),
        ("flops_xla", "FLOPs XLA", ".3e"),
    ]
    print_table(rows, cols)
    for name, rr in floor_ratios:
        print(
            f"{name} batch 1 / its matmul floor, {len(rr)} interleaved rounds: median "
            f"{statistics.median(rr):.2f}x (range {min(rr):.2f}-{max(rr):.2f}x)"
        )
    for name, batch, ratio in ratios:
        print(f"{name} batch {batch}: PyTorch / JAX median time = {ratio:.2f}x")
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
