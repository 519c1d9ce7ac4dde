"""One real run's configuration: a tree of frozen, typed component configs (``runtime.job.JobConfig``).

``JobConfig`` holds the run's own fields (``workdir``, ``steps``, ``seed``,
``timeout_s``) and one section per component: ``schedule`` (a preset of
``gyre.presets`` scaled to ``nodes`` cells of ``C_e`` executions, groups of
``N``, batches of ``B``, with per-field ``overrides``), ``model`` (the tiny
toy model, or a Hugging Face ``checkpoint``), ``harness``, ``tasks``,
``training`` (the plane: learning rate, tensor-parallel ranks, tokens per
micro-step, restarts), ``proxy``, ``layout`` (the device and a CUDA job's
``GpuLayout``), ``metrics`` and ``cluster`` (a ``ClusterConfig``, or None).

Every field is read from one place of the job file: its ``key`` (a ``[job]``
key, or ``table.key`` for the ``[model]`` table), which ``runtime.job_file``
maps both ways. A new field is one line in its section (its key defaults to
its name).

Invariants: constructors do no I/O (no file read, no import of a named
class, no tokenizer) and refuse an impossible value with ValueError naming the
field as the job file spells it (``job field tp ...``); every field has the
type of its default (an int passes for a float). What the fields name (files,
classes, the network interface) is checked by each section's ``build`` and by
``JobConfig.check_environment``, which do the I/O.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from gyre.config import ConfigError, SchedulerConfig
from gyre.presets import ClusterShape, build_preset
from gyre.real.harness.runner import Budgets
from gyre.real.harness.sandbox import ISOLATE_MODES
from gyre.real.runtime.layout import PUBLICATIONS, GpuLayout
from gyre.real.runtime.metrics import WANDB_MODES
from gyre.real.runtime.tables import from_table

if TYPE_CHECKING:
    from gyre.real.cluster.config import ClusterConfig
    from gyre.real.train.model import ModelConfig

DTYPES = ("", "float32", "bfloat16")  # "": the checkpoint's own (float32 for the toy model)


def spec(default: Any = dataclasses.MISSING, *, key: str = "", minimum: float | None = None,
         table: Callable[[Any], Any] | None = None, factory: Callable[[], Any] | None = None) -> Any:
    """A config field: where the job file holds it (``key``: default its own name), the least value it
    takes, and ``table``: the parser of a sub-table the field holds as a checked dataclass."""
    meta = {"key": key, "minimum": minimum, "table": table}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def file_key(f: dataclasses.Field[Any]) -> str:
    """Where field ``f`` lives in the job file: a ``[job]`` key, or ``table.key``."""
    return f.metadata.get("key") or f.name


def check_fields(config: Any) -> None:
    """ValueError naming the first field whose value has not its default's type, or is below its minimum."""
    for f in fields(config):
        value = getattr(config, f.name)
        default = f.default if f.default is not dataclasses.MISSING else None
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        if f.metadata.get("table") is not None or _is_section(default):
            continue
        problem = _type_problem(value, default, f.metadata.get("minimum"))
        if problem:
            raise ValueError(f"job field {file_key(f)} must be {problem}, not {value!r}")


def _type_problem(value: Any, default: Any, minimum: float | None) -> str:
    if isinstance(default, Mapping):
        return "" if isinstance(value, Mapping) else "a table"
    if isinstance(default, bool):
        return "" if isinstance(value, bool) else "true or false"
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, int) and not (isinstance(value, int) and numeric):
        return "an integer" + (f" >= {minimum:g}" if minimum is not None else "")
    if isinstance(default, float) and not numeric:
        return "a number" + (f" >= {minimum:g}" if minimum is not None else "")
    if isinstance(default, str) and not isinstance(value, str):
        return "text"
    if numeric and not math.isfinite(value):
        return "a finite number"
    if minimum is not None and value < minimum:
        return ("an integer" if isinstance(default, int) else "a number") + f" >= {minimum:g}"
    return ""


def _is_section(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and type(value).__module__ == __name__


def _cluster_table(table: Any) -> ClusterConfig | None:
    from gyre.real.cluster.config import cluster_from_table

    if table == {}:  # an empty table (a job.json written before the tree): one machine
        return None
    return cluster_from_table(table, check_local=False)  # this machine's interface: check_environment


def _layout_table(table: Any) -> GpuLayout | None:
    return from_table(GpuLayout, table, "layout") if table != {} else None  # an empty table: none given


@dataclass(frozen=True, kw_only=True)
class ScheduleSection:
    preset: str = "gyre-1"  # any name of gyre.presets.PRESETS
    nodes: int = spec(2, minimum=1)  # single-node cells (each: one SGLang engine + one training cell)
    C_e: int = spec(2, minimum=1)  # concurrent executions per node
    N: int = spec(2, minimum=1)
    B: int = spec(2, minimum=1)
    overrides: dict[str, Any] = spec(key="schedule", factory=dict)  # SchedulerConfig field overrides

    def __post_init__(self) -> None:
        if not isinstance(self.overrides, Mapping):
            raise ValueError(f"job field schedule must be a table of schedule fields, not {self.overrides!r}")
        check_fields(self)
        try:
            self.scheduler()  # the presets' and the policy core's own checks name any impossible value
        except (ConfigError, TypeError) as exc:
            raise ValueError(f"schedule: {exc}") from None

    def shape(self) -> ClusterShape:
        return ClusterShape(nodes=self.nodes, nodes_per_cell=1, per_node_capacity=self.C_e, N=self.N, B=self.B)

    def scheduler(self) -> SchedulerConfig:
        """The preset on this job's cluster, with the ``overrides`` applied."""
        return build_preset(self.preset, self.shape(), **self.overrides)


@dataclass(frozen=True, kw_only=True)
class ModelSection:
    model_dir: str = "runs/tiny-tokenizer"  # the tiny tokenizer's folder (trained there if missing)
    checkpoint: str = spec("", key="model.checkpoint")  # a Hugging Face folder; empty: the tiny toy model
    dtype: str = spec("", key="model.dtype")

    def __post_init__(self) -> None:
        check_fields(self)
        if self.dtype not in DTYPES:
            raise ValueError(f"[model] dtype must be float32 or bfloat16, not {self.dtype!r}")

    def hf_config(self, seed: int) -> ModelConfig | None:
        """The cells' ``ModelConfig`` read from the checkpoint (None: the toy model); reads the folder."""
        if not self.checkpoint:
            return None
        folder = Path(self.checkpoint)
        if not folder.exists():
            raise ValueError(f"[model] checkpoint {folder}: no config.json, the folder does not exist: set it to "
                             f"a Hugging Face checkpoint folder on this machine (nothing is downloaded)")
        if not (folder / "config.json").is_file():
            raise ValueError(f"[model] checkpoint {folder}: no config.json (a Hugging Face checkpoint folder)")
        from gyre.real.train.bridge import model_config_from_hf

        try:
            return model_config_from_hf(folder, dtype=self.dtype or None, init_seed=1234 + seed,
                                        max_sequence_length=4096)
        except (KeyError, ValueError) as exc:
            raise ValueError(f"[model] checkpoint {folder}: {exc}") from None

    def toy_config(self, seed: int) -> ModelConfig:
        """The tiny toy model's ``ModelConfig`` (vocabulary: the tiny tokenizer's, trained if missing)."""
        from transformers import AutoTokenizer

        from gyre.real.toy.tiny_model import build_tiny_tokenizer
        from gyre.real.train.model import ModelConfig

        folder = build_tiny_tokenizer(Path(self.model_dir))
        vocab = len(AutoTokenizer.from_pretrained(str(folder)))
        return ModelConfig(vocab_size=vocab, max_sequence_length=4096, init_seed=1234 + seed,
                           tokenizer=str(folder))  # every export carries it (train.publish)

    def build(self, seed: int) -> tuple[Path, ModelConfig]:
        """The tokenizer's folder and the cells' model (trains the tiny tokenizer if it is missing)."""
        model = self.hf_config(seed)
        if model is not None:  # a Hugging Face checkpoint: the cells load it, its tokenizer serves
            return Path(self.checkpoint), model
        from gyre.real.toy.tiny_model import build_tiny_tokenizer

        return build_tiny_tokenizer(Path(self.model_dir)), self.toy_config(seed)


@dataclass(frozen=True, kw_only=True)
class HarnessSection:
    name: str = spec("scripted", key="harness")  # scripted | mini-swe-agent | claude-code | codex | "module:Class"
    options: dict[str, Any] = spec(key="harness_options", factory=dict)  # the adapter's keyword arguments
    calls: int = spec(2, minimum=0)  # model calls per scripted-harness execution
    harness_timeout_s: float = 600.0  # a harness is killed here; its work is still scored
    overall_timeout_s: float = 900.0  # harness + evaluation retries; past it the execution is excluded
    isolate: str = "auto"  # each harness in its own loopback-only network namespace: auto | always | never
    supervisor_grace_s: float = spec(300.0, minimum=0)  # the supervisor stops the harnesses this long after its
    # lease expired (real.supervisor; finite: nothing is left running when no driver comes back)

    def __post_init__(self) -> None:
        if self.isolate not in ISOLATE_MODES:
            raise ValueError(f"job field isolate must be one of {ISOLATE_MODES}, not {self.isolate!r}")
        check_fields(self)
        self.budgets()

    def budgets(self) -> Budgets:
        return Budgets(harness_timeout_s=self.harness_timeout_s, overall_timeout_s=self.overall_timeout_s)

    def build(self) -> Any:
        """The harness adapter (the scripted one makes ``calls`` calls unless its options say); imports it."""
        from gyre.real.harness.plugins import resolve_harness

        options: Any = dict(self.options)
        if self.name == "scripted":
            options = {"calls": self.calls, "compact_every": 0, "subagent_at": (), **options}
        return resolve_harness(self.name, options)


@dataclass(frozen=True, kw_only=True)
class TasksSection:
    path: str = spec("", key="tasks")  # a task set (JSONL, harness.taskset); empty: the toy task on `target`
    evaluator: str = ""  # "module:Class" scoring the task set (with `tasks`)
    target: str = "e"  # the toy task's reward: the share of characters equal to it

    def __post_init__(self) -> None:
        check_fields(self)
        if bool(self.path) != bool(self.evaluator):
            raise ValueError("job fields tasks and evaluator go together: a task set needs its evaluator "
                             f"(\"module:Class\"), got tasks={self.path!r}, evaluator={self.evaluator!r}")

    def build(self, seed: int) -> Any:
        """A ``TaskSet`` (reads every line, imports the evaluator) or the toy ``EmitCharTask``."""
        if not self.path:
            from gyre.real.toy.tasks import EmitCharTask

            return EmitCharTask(self.target)
        from gyre.real.harness.taskset import load_taskset

        return load_taskset(self.path, self.evaluator, seed=seed)


@dataclass(frozen=True, kw_only=True)
class TrainingSection:
    lr: float = spec(1e-3, minimum=0)
    tp: int = spec(1, minimum=1)  # tensor-parallel ranks per training cell (cuda: layout.tensor_parallel instead)
    token_budget: int = spec(4096, minimum=1)  # tokens per micro-step
    cell_restarts: int = spec(2, minimum=0)  # a run whose training cell died resumes itself this often

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, kw_only=True)
class ProxySection:
    max_tokens: int = spec(12, minimum=1)  # a model call's default max_tokens

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, kw_only=True)
class LayoutSection:
    device: str = "cpu"  # cpu | cuda (cuda needs the [job.layout] table's GPUs)
    gpus: GpuLayout | None = spec(None, key="layout", table=_layout_table)  # runtime.layout
    publication: str = "auto"  # disk | memory | auto (memory on cuda, disk on cpu: publication_route)

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"job field device must be cpu or cuda, not {self.device!r}")
        if self.device == "cpu" and self.gpus is not None:
            raise ValueError("job field layout applies to device = \"cuda\" only")
        if self.publication not in PUBLICATIONS:
            raise ValueError(f"job field publication must be one of {PUBLICATIONS}, not {self.publication!r}")

    def publication_route(self) -> str:
        """How new weights reach the engines: ``publication``, or for ``auto`` the path measured faster where
        it works (docs/gpu.md#publication-from-memory): from memory on CUDA, from disk on CPU."""
        if self.publication != "auto":
            return self.publication
        return "memory" if self.device == "cuda" else "disk"


@dataclass(frozen=True, kw_only=True)
class MetricsSection:
    wandb: str = ""  # "offline": metrics also to an offline W&B run in WORKDIR/wandb (runtime.metrics)

    def __post_init__(self) -> None:
        if self.wandb not in WANDB_MODES:
            raise ValueError(f"job field wandb must be \"offline\" or \"\" (off), not {self.wandb!r}: a run never "
                             "sends metrics over the network itself (wandb sync uploads an offline run)")


@dataclass(frozen=True, kw_only=True)
class JobConfig:
    workdir: str = "runs/cpu-demo"
    steps: int = spec(4, minimum=1)  # trained steps: whole bursts of the schedule's mu
    seed: int = 0
    timeout_s: float = spec(900.0, minimum=0)  # the whole run's
    schedule: ScheduleSection = spec(factory=ScheduleSection)
    model: ModelSection = spec(factory=ModelSection)
    harness: HarnessSection = spec(factory=HarnessSection)
    tasks: TasksSection = spec(factory=TasksSection)
    training: TrainingSection = spec(factory=TrainingSection)
    proxy: ProxySection = spec(factory=ProxySection)
    layout: LayoutSection = spec(factory=LayoutSection)
    metrics: MetricsSection = spec(factory=MetricsSection)
    cluster: ClusterConfig | None = spec(None, table=_cluster_table)  # real.cluster: None, one machine

    def __post_init__(self) -> None:
        """What needs two sections (or a section and the run's fields): no file read, no import."""
        for f in fields(self):
            cls = section_class(f)
            if cls is not None and not isinstance(getattr(self, f.name), cls):
                raise ValueError(f"job section {f.name} must be a {cls.__name__}, not {getattr(self, f.name)!r}")
        check_fields(self)
        mu = self.scheduler().mu
        if self.steps % mu:
            raise ValueError(f"job field steps must be a positive multiple of mu = {mu} (whole bursts), "
                             f"not {self.steps}")
        if self.layout.device == "cuda":
            self.gpu_layout()
        if self.layout.device == "cuda" and self.training.tp not in (1, self.cell_tp()):
            raise ValueError(f"job field tp = {self.training.tp} disagrees with layout.tensor_parallel = "
                             f"{self.cell_tp()}: on device = \"cuda\" a cell's ranks are the layout's; leave tp out")

    def scheduler(self) -> SchedulerConfig:
        return self.schedule.scheduler()

    def cell_tp(self) -> int:
        """Tensor-parallel ranks (processes) per training cell: ``training.tp``, or the layout's on CUDA."""
        return self.gpu_layout().tensor_parallel if self.layout.device == "cuda" else self.training.tp

    def gpu_layout(self) -> GpuLayout:
        """The checked ``GpuLayout`` of a CUDA job (``runtime.layout``)."""
        if not self.model.checkpoint:
            raise ValueError("device = \"cuda\" needs a [model] checkpoint (a Hugging Face Qwen folder)")
        if self.scheduler().C_s > 0:
            raise ValueError(f"preset {self.schedule.preset!r} keeps a separate rollout pool, which [job.layout] "
                             f"gives no GPUs; choose a preset without one on device = \"cuda\"")
        layout = self.layout.gpus or GpuLayout()
        layout.check(self.schedule.nodes, placed=self.cluster is not None)
        return layout

    def check_cells(self, model: ModelConfig) -> None:
        """Raise ValueError unless the training cells can hold ``model`` over ``cell_tp()`` ranks."""
        from gyre.real.train.context import CellConfig

        try:
            CellConfig(cells=self.scheduler().K, store_port=0, queue_root="", workdir="",
                       device=self.layout.device, model=model, tp=self.cell_tp())
        except ValueError as exc:
            raise ValueError(f"training cells of tp = {self.cell_tp()} ranks: {exc}") from None

    def check_environment(self) -> JobConfig:
        """What the fields name, looked at before anything starts (files read, classes imported, the tiny
        tokenizer trained when a split needs its vocabulary): ValueError names the field; ``self`` when all
        is well. ``load_job_config`` and a resume run it."""
        model = self.model.hf_config(self.seed)  # a checkpoint the bridge cannot load fails here
        self.harness.build()  # an unknown harness or unimportable class fails here
        self.tasks.build(self.seed)  # every line of the task set and every evaluator's arguments
        if self.cluster is not None and self.cluster.interface:
            from gyre.real.cluster.config import check_interface

            check_interface(self.cluster.interface)  # the driver runs on the head: its interface must be here
        if self.cell_tp() > 1:  # the model must split over the cell's ranks; CellConfig's check names what cannot
            self.check_cells(model or self.model.toy_config(self.seed))
        return self


def section_class(f: dataclasses.Field[Any]) -> type | None:
    """The section class a ``JobConfig`` field holds (None: one of the run's own fields, or ``cluster``)."""
    factory = f.default_factory
    return factory if isinstance(factory, type) and factory.__module__ == __name__ else None
