"""hetfl's ServerApp: runs any hetfl method's strategy on Flower through ``deployment.deployment``.

Its run config (``flwr run APP --run-config ...``) names either ``config``, a TOML (or JSON) file
of hetfl options on the SuperLink's machine (a new run folder is created under its ``out``), or
``run-dir``, a run folder to continue from its last checkpoint (``hetfl deploy`` creates the
folder first and passes it here; ``hetfl deploy --resume`` passes an interrupted one). With
``secure-aggregation = true`` (and optionally ``secure-clipping-range``) every round runs Flower's
SecAgg+ (``secure``); a run folder started that way stays secure when resumed.
"""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from ..errors import HetflError
from ..methods import load_config
from ..report import run_table
from .baton import FLOOR, HETFL, Baton, taking_turns
from .deployment import deployment, resume_deployment
from .secure import settings_from_run_config

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Returns None; runs the experiment the run config names and prints its summary table."""
    config, run_dir = str(context.run_config.get("config", "")), str(context.run_config.get("run-dir", ""))
    try:
        if bool(config) == bool(run_dir):
            raise HetflError("the run config must name either config (a hetfl TOML file) or run-dir (a run folder "
                             f"to continue), got config={config!r} run-dir={run_dir!r}")
        secure = settings_from_run_config(dict(context.run_config))  # else a resumed run folder may say so
        experiment = (resume_deployment(run_dir, grid, secure) if run_dir
                      else deployment(load_config(config), grid, secure))
        if baton := Baton.from_env():  # hetfl bench flower's: rounds in turn with Flower's floor
            experiment.on_round = taking_turns(experiment.on_round, baton, me=HETFL, other=FLOOR)
        summary = experiment.run(progress=False)
    except HetflError as e:
        print(f"hetfl: error: {e}", flush=True)
        raise
    print(run_table(summary), flush=True)
