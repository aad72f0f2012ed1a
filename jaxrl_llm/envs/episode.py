"""One multi-turn episode, token-exact, and the reference loop that plays it.

An `Episode` holds the token ids of the whole conversation as the model saw them: the
prompt's, the model's sampled ones (never re-tokenized) and the environment's (the
chat template's suffixes, `ChatRenderer.suffix_ids`), with per-token roles and the
sampler's log-probs, aligned. The model's tokens, and only they, have role 'assistant'
and loss mask 1; prompt tokens have role 'prompt'; an environment reply's tokens have
its messages' role ('tool', 'user'; 'tool+user' if one reply mixes roles, as its
template text does not split per message in general).

`ended` says why the episode stopped:

  done                the environment's step returned done
  eos                 the model's turn ended with the tokenizer's eos, which is not the
                      end-of-turn token (e.g. <|endoftext|> after <|im_end|>)
  max_new_tokens      the model's turn ended without the end-of-turn token (the
                      sampler's per-turn limit)
  max_turns           `max_turns` model turns were played and the environment was not done
  max_episode_tokens  the next turn or reply would not fit in `max_episode_tokens`
  env_error           the environment raised (the trainer's `on_env_error = 'drop'`)

The length rule: an episode never holds more than `max_episode_tokens` tokens. A model
turn that would pass it is cut to fit (its log-probs with it) and ends the episode. An
environment reply is appended only whole and only if at least one token is left after
it for the model; otherwise it is dropped (not in `messages` either) and the episode
ends. After the last allowed turn the environment's step still runs (its reward and
done count) but its reply is dropped: no model turn would read it.
"""
import dataclasses
from typing import Any, Callable, Sequence

from jaxrl_llm.envs import base
from jaxrl_llm.envs import chat

ENDINGS = ("done", "eos", "max_new_tokens", "max_turns", "max_episode_tokens", "env_error")
MODEL, PROMPT = "assistant", "prompt"


@dataclasses.dataclass
class Episode:
  """The token-exact record of one episode; the lists over tokens are aligned.

  Attributes:
    tokens: every token id, prompt included.
    roles: each token's role ('prompt', 'assistant', or the environment's roles).
    logprobs: the sampler's log-probs on the model's tokens, 0.0 elsewhere.
    messages: the conversation: opening messages, the model's turns as decoded text,
      the environment's messages; only what is in `tokens`.
    tools: the tool schemas the chat template rendered into the opening (the renderer's;
      None without tools): with `messages`, what the template turns into `tokens`.
    turn_lengths: the model's tokens in each of its turns.
    turn_rewards: the environment's reward for each model turn (0.0 until stepped).
    turn_infos: the environment's `info` for each stepped turn.
    parts: (role, messages, tokens) of each stretch in order: the prompt, a model turn,
      an environment reply, ...
    ended: one of ENDINGS, None while running.
    turn_versions: the policy version that sampled each model turn, where the player
      knows it (partial rollouts of episodes), else empty.
    routing: an MoE policy's experts int32 [fed tokens, MoE layers, k] of `tokens` in order
      (those fed to the model: all but the last model token; routing replay's record), or
      None.
  """
  tokens: list[int] = dataclasses.field(default_factory=list)
  roles: list[str] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  messages: list[dict] = dataclasses.field(default_factory=list)
  turn_lengths: list[int] = dataclasses.field(default_factory=list)
  turn_rewards: list[float] = dataclasses.field(default_factory=list)
  turn_infos: list[dict] = dataclasses.field(default_factory=list)
  parts: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)
  ended: str | None = None
  tools: list[dict] | None = None
  turn_versions: list[int] = dataclasses.field(default_factory=list)
  routing: Any = None

  @classmethod
  def start(cls, renderer: chat.ChatRenderer, messages: list[dict]) -> "Episode":
    """An episode holding the opening `messages`, rendered for the model's first turn."""
    episode = cls(tools=[dict(t) for t in renderer.tools] if renderer.tools else None)
    episode.append(renderer.prompt_ids(messages), PROMPT, messages)
    return episode

  def append(self, ids, role, messages, logprobs=None):
    """Appends a stretch of tokens of one role and the messages they render (the opening,
    or what an agent program added between its calls: `rollouts.agents`)."""
    self.tokens += ids
    self.roles += [role] * len(ids)
    self.logprobs += [0.0] * len(ids) if logprobs is None else logprobs
    self.messages += [dict(m) for m in messages]
    self.parts.append((role, len(messages), len(ids)))

  @property
  def num_turns(self) -> int:
    return len(self.turn_lengths)

  def end(self, why: str) -> None:
    if why not in ENDINGS:
      raise ValueError(f"Episode ending {why!r} is not one of {ENDINGS}.")
    self.ended = why

  def add_model_turn(self, ids: Sequence[int], logprobs: Sequence[float], text: str) -> None:
    """Appends the model's sampled turn (ids as sampled, END included) and its text."""
    if self.ended is not None:
      raise ValueError(f"add_model_turn: the episode has ended ({self.ended!r}).")
    if not self.messages or self.messages[-1]["role"] == MODEL:
      raise ValueError("add_model_turn: a model turn must follow the prompt or an environment "
                       "reply, not another model turn.")
    ids, logprobs = [int(t) for t in ids], [float(x) for x in logprobs]
    if len(ids) != len(logprobs):
      raise ValueError(f"add_model_turn: {len(ids)} ids but {len(logprobs)} log-probs; "
                       "expected one log-prob per id.")
    self.append(ids, MODEL, [{"role": MODEL, "content": text}], logprobs)
    self.turn_lengths.append(len(ids))
    self.turn_rewards.append(0.0)
    self.turn_infos.append({})

  def add_env_messages(self, renderer: chat.ChatRenderer, new_messages: list[dict],
                       max_episode_tokens: int | None = None) -> bool:
    """Appends the environment's reply to the model's last turn, if it fits (see above).

    Returns:
      True if appended; False if it would leave no token for the model's next turn
      within `max_episode_tokens`, in which case nothing is appended and the episode
      ends with 'max_episode_tokens'.
    """
    if self.ended is not None:
      raise ValueError(f"add_env_messages: the episode has ended ({self.ended!r}).")
    ids = renderer.suffix_ids(self.messages, new_messages)
    if max_episode_tokens is not None and len(self.tokens) + len(ids) >= max_episode_tokens:
      self.end("max_episode_tokens")
      return False
    roles = list(dict.fromkeys(m["role"] for m in new_messages))
    self.append(ids, "+".join(roles), new_messages)
    return True

  def loss_mask(self) -> list[int]:
    """1 on the model's tokens, 0 elsewhere."""
    return self.role_mask(MODEL)

  def role_mask(self, role: str) -> list[int]:
    return [int(r == role) for r in self.roles]

  def as_row(self) -> dict:
    """The episode's fields of a rollouts.jsonl row (see training/rollout_log.py).

    `messages` is the whole conversation, the opening (system prompt, user) included;
    `tools` (only where the template rendered tool schemas) holds them, so that
    `apply_chat_template(messages, tools=tools)` gives the text of `tokens`.
    `turn_versions` (partial rollouts only): the policy version of each model turn.
    `reward`/`reward_parts` hold the environment's turn rewards only ({'env': total});
    the trainer adds its reward functions' parts and total.
    """
    env_reward = float(sum(self.turn_rewards))
    tools = {"tools": [dict(t) for t in self.tools]} if self.tools else {}
    return {
        "messages": [dict(m) for m in self.messages],
        **tools,
        "turn_roles": [p[0] for p in self.parts],
        "turn_messages": [p[1] for p in self.parts],
        "turn_tokens": [p[2] for p in self.parts],
        "num_turns": self.num_turns,
        "turn_rewards": list(self.turn_rewards),
        "reward": env_reward,
        "reward_parts": {"env": env_reward},
        "ended": self.ended,
        "tokens": list(self.tokens),
        "loss_mask": self.loss_mask(),
        "behaviour_logprobs": list(self.logprobs),
        **({"turn_versions": list(self.turn_versions)} if self.turn_versions else {}),
    }


SampleTurn = Callable[[list[int]], tuple[Sequence[int], Sequence[float]]]


def run_episode(env, renderer: chat.ChatRenderer, record: dict, sample_turn: SampleTurn, *,
                max_turns: int, max_episode_tokens: int, where: str = "episode") -> Episode:
  """Plays one episode: the reference semantics of a multi-turn rollout.

  reset -> prompt ids -> loop {sample a turn from all tokens so far; decode its text
  (without END); env.step(the conversation); append the reply's suffix ids}, until
  done / max_turns / max_episode_tokens or a turn without END (see the module docstring).

  Args:
    env: an Environment (`reset`, `step`); its exceptions become EnvError naming `where`.
    renderer: the tokenizer's ChatRenderer (with the environment's tool schemas).
    record: the dataset record for `reset`.
    sample_turn: token ids -> (the turn's new ids, their log-probs); the sampler stops at
      the end-of-turn token.
    max_turns: model turns at most (>= 1).
    max_episode_tokens: tokens at most, prompt included.
    where: names the episode in errors, e.g. "environment 'calc' (env.py:CalcEnv), record 17".

  Returns:
    The ended Episode.
  """
  if max_turns < 1 or max_episode_tokens < 1:
    raise ValueError(f"run_episode: max_turns = {max_turns}, max_episode_tokens = "
                     f"{max_episode_tokens}; expected both >= 1.")
  opening = base.as_messages(base.call_env(env, "reset", record, where=where), where)
  episode = Episode.start(renderer, opening)
  if len(episode.tokens) >= max_episode_tokens:
    raise base.EnvError(f"{where}: the opening messages are {len(episode.tokens)} tokens, which "
                        f"leaves no room within max_episode_tokens = {max_episode_tokens}.")
  eot, eos = renderer.end_of_turn_id, renderer.tokenizer.eos_token_id
  for turn in range(1, max_turns + 1):
    ids, logprobs = sample_turn(list(episode.tokens))
    ids, logprobs = [int(t) for t in ids], [float(x) for x in logprobs]
    if eot in ids[:-1]:
      raise ValueError(f"{where}, turn {turn}: the sampled turn has the end-of-turn token "
                       f"{eot} at position {ids.index(eot)} of {len(ids)}; the sampler must "
                       "stop there.")
    room = max_episode_tokens - len(episode.tokens)
    cut = len(ids) > room
    ids, logprobs = ids[:room], logprobs[:room]
    episode.add_model_turn(ids, logprobs, renderer.decode_turn(ids))
    if cut:
      episode.end("max_episode_tokens")
      break
    if not ids or ids[-1] != eot:
      episode.end("eos" if ids and ids[-1] == eos else "max_new_tokens")
      break
    turn_where = f"{where}, turn {turn}"
    conversation = [dict(m) for m in episode.messages]
    result = base.as_step_result(base.call_env(env, "step", conversation, where=turn_where),
                                 turn_where)
    episode.turn_rewards[-1], episode.turn_infos[-1] = result.reward, result.info
    if result.done:
      episode.end("done")
      break
    if turn == max_turns:
      episode.end("max_turns")
      break
    if not episode.add_env_messages(renderer, result.messages, max_episode_tokens):
      break
  return episode
