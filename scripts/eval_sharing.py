"""What scoring truncated models from a larger one's logits saves: SplitMix on its defaults (Fashion-MNIST, 20
clients, four served models whose bases are a subset of the global model's), one evaluation as the simulator runs it
against every served model run alone (``hetfl.sim.truncations`` returning nothing); alternating, median of 3.

    .venv/bin/python scripts/eval_sharing.py
"""

import statistics
import time

import hetfl.sim as simulator
from hetfl.methods import config_from
from hetfl.sim import Simulation


def main() -> None:
    sim = Simulation(config_from({"method": "splitmix", "rounds": 1, "num_clients": 20}))
    print("served models:", ", ".join(sim.method.eval_specs()))
    shared = simulator.truncations
    times: dict[str, list[float]] = {"shared": [], "alone": []}
    results = {}
    for repeat in range(3):
        for name in ("shared", "alone") if repeat % 2 == 0 else ("alone", "shared"):
            simulator.truncations = shared if name == "shared" else (lambda *args: {})
            start = time.perf_counter()
            results[name] = sim.evaluate()
            times[name].append(time.perf_counter() - start)
    simulator.truncations = shared
    print("seconds:", {k: [round(t, 1) for t in v] for k, v in times.items()})
    print("identical scores:", results["shared"] == results["alone"])
    s, a = statistics.median(times["shared"]), statistics.median(times["alone"])
    print(f"splitmix evaluation, shared / alone (median of 3): {s:.2f} s / {a:.2f} s = {s / a:.3f}")


if __name__ == "__main__":
    main()
