"""A verifiers (>= 0.4, `verifiers.v1`) taskset as an agent program.

  config.data.agent = "jaxrl_llm.envs.verifiers_agent:run"  (configs/grpo_verifiers_calculator.py)
  VF_TASKSET=my_taskset_module    (or a record field `taskset`: a verifiers taskset id)

Needs `pip install verifiers==0.4.0 uv` (Python >= 3.11; verifiers pins openai < 3) and
`uv` on PATH: verifiers' `null` harness runs its chat loop as a PEP 723 uv script whose
dependencies (openai, mcp, httpx, ...) come from PyPI or a warm uv cache. Imports nothing
from jaxrl_llm: it works against any OpenAI-compatible endpoint that streams.

What it does. Per process and taskset id it builds one `vf.SingleAgentEnv` (the `null`
harness: a plain chat loop with the taskset's MCP tools; the local `SubprocessConfig`
runtime, no sandbox) and keeps it serving (its shared tool servers and interception
server stay up). For each record it takes the taskset's task at `record["vf_idx"]` if
given, else builds the taskset's task type from the record's fields that its TaskData
declares (e.g. `prompt`, `answer`), plays it with verifiers' eval client pointed at
`client.base_url` (the trainer's episode-scoped endpoint: the harness's calls land in
the episode's log, which the trainer assembles token-exactly) and returns
`(trace.reward, {"vf/<reward>": value, ...})`.

Limits. verifiers' eval client gives no token ids; the trainer takes them from its own
log. Each episode starts the chat program (a Python process) and runs the tool calls
through MCP: seconds of CPU per episode. Sampling is the trainer's (temperature, per-call
token budget); the harness stops after `VF_MAX_TURNS` model calls (default 3; keep it
<= the source's `max_turns`, beyond which the endpoint answers 400). An episode whose
harness failed returns reward 0 with `vf/error` = 1 (raise instead: `VF_STRICT=1`).
"""
import asyncio
import importlib
import os
import shutil
import sys

_ENVS = {}  # taskset id -> (env, its tasks list or None, the serving context)
_LOCK = asyncio.Lock()
API_KEY_VAR = "VF_AGENT_API_KEY"  # the endpoint's key: any value (the episode URL scopes)


def _flat_id(taskset: str) -> str:
  """verifiers imports a taskset by a flat module name (0.4.0: a dotted id fails in its
  `find_spec("verifiers.v1.tasksets.<id>")`): a dotted module is imported here and
  aliased as 'a__b__c'."""
  if "." not in taskset:
    return taskset
  alias = taskset.replace(".", "__").lower()
  sys.modules.setdefault(alias, importlib.import_module(taskset))
  return alias


async def _environment(taskset: str):
  async with _LOCK:
    if taskset not in _ENVS:
      here = os.path.dirname(sys.executable)  # a venv's `uv`, if PATH lacks one
      if not shutil.which("uv") and os.path.exists(os.path.join(here, "uv")):
        os.environ["PATH"] = here + os.pathsep + os.environ.get("PATH", "")
      import verifiers.v1 as vf  # pylint: disable=g-import-not-at-top
      env = vf.load_environment(vf.SingleAgentEnvConfig(
          taskset={"id": _flat_id(taskset)},
          agent=vf.AgentConfig(harness={"id": "null"}, runtime=vf.SubprocessConfig(),
                               max_turns=int(os.environ.get("VF_MAX_TURNS", "3")),
                               network_notice=False)))
      serving = env.serving()  # held for the process's life (tool servers, interception)
      await serving.__aenter__()
      _ENVS[taskset] = [env, None, serving]
    return _ENVS[taskset]


def _task(entry, record: dict):
  env = entry[0]
  if "vf_idx" in record:
    if entry[1] is None:
      entry[1] = list(env.taskset)
    return entry[1][int(record["vf_idx"])]
  task_type = env.taskset.task_type()
  data_type = task_type.data_type()
  fields = {k: v for k, v in record.items() if k in data_type.model_fields and k != "idx"}
  return task_type(data_type(**fields), env.taskset.config.task)


async def run(client, record: dict):
  """Plays `record` as one verifiers episode through `client`'s endpoint; returns
  (reward, info)."""
  import verifiers.v1 as vf  # pylint: disable=g-import-not-at-top
  from verifiers.v1.env import RunSlot  # pylint: disable=g-import-not-at-top
  taskset = record.get("taskset") or os.environ.get("VF_TASKSET")
  if not taskset:
    raise ValueError("verifiers_agent: set VF_TASKSET (a verifiers taskset id) or give the "
                     "records a `taskset` field")
  entry = await _environment(taskset)
  os.environ.setdefault(API_KEY_VAR, "episode")
  ctx = vf.ModelContext(
      model=os.environ.get("VF_MODEL", "policy"),
      client=vf.EvalClientConfig(base_url=str(client.base_url).rstrip("/"),
                                 api_key_var=API_KEY_VAR),
      sampling=vf.SamplingConfig())  # the trainer's sampling settings apply
  episode = await entry[0].run_slot(RunSlot(_task(entry, record)), ctx)
  trace = episode.traces[-1] if episode.traces else None
  errors = [e.message for e in episode.errors] + (
      [trace.last_error.message] if trace is not None and trace.last_error else [])
  if errors and os.environ.get("VF_STRICT") == "1":
    raise RuntimeError(f"verifiers episode failed: {errors[0]}")
  info = {f"vf/{k}": r.score for k, r in (trace.rewards if trace else {}).items() if r}
  info["vf/error"] = float(bool(errors))
  return float(trace.reward if trace is not None else 0.0), info
