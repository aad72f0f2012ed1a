"""Episodes: aligned masks, the exact token sequence of the whole conversation, endings."""
import json

from absl.testing import absltest
from absl.testing import parameterized

from jaxrl_llm import envs
from tests.envs import envs_testdata as td

RECORD = {"prompt": "What is 12*34?"}
CALL = td.call("calc", expression="12*34")
ANSWER = "The answer is 408."


class Scripted:
  """A sampler playing fixed turns (the last one repeats); records what it was shown."""

  def __init__(self, renderer, texts, stop=True, extra=()):
    self.renderer, self.texts, self.stop, self.extra = renderer, list(texts), stop, list(extra)
    self.seen = []

  def __call__(self, token_ids):
    self.seen.append(list(token_ids))
    text = self.texts[min(len(self.seen), len(self.texts)) - 1]
    ids = self.renderer.encode(text) + self.extra
    ids += [self.renderer.end_of_turn_id] if self.stop else []
    return ids, [-0.5 - 0.01 * i for i in range(len(ids))]


class CountingCalcEnv(td.CalcEnv):

  def __init__(self, **env_args):
    super().__init__(**env_args)
    self.steps = 0

  def step(self, messages):
    self.steps += 1
    return super().step(messages)


def renderer(name):
  if name == "bpe_chatml":
    return envs.ChatRenderer(td.bpe_tokenizer(), tools=td.CalcEnv().tool_schemas())
  return envs.ChatRenderer(td.char_tokenizer_with_tools(), tools=td.CalcEnv().tool_schemas())


def play(r, texts, env=None, max_turns=4, max_episode_tokens=4096, **sampler_args):
  env = env or CountingCalcEnv()
  sampler = Scripted(r, texts, **sampler_args)
  episode = envs.run_episode(env, r, RECORD, sampler, max_turns=max_turns,
                             max_episode_tokens=max_episode_tokens, where="record 7")
  return episode, sampler, env


class EpisodeTest(absltest.TestCase):

  def test_masks_roles_and_row_aligned(self):
    r = renderer("char")
    opening = td.CalcEnv().reset(RECORD)
    episode = envs.Episode.start(r, opening)
    n_prompt = len(episode.tokens)
    turn = r.encode(CALL) + [r.end_of_turn_id]
    episode.add_model_turn(turn, [-1.0] * len(turn), CALL)
    reply = [{"role": "tool", "content": "408"}]
    self.assertTrue(episode.add_env_messages(r, reply))
    suffix = r.suffix_ids(opening + [{"role": "assistant", "content": CALL}], reply)
    last = r.encode(ANSWER) + [r.end_of_turn_id]
    episode.add_model_turn(last, [-2.0] * len(last), ANSWER)
    episode.end("done")

    n = len(episode.tokens)
    self.assertEqual(n, n_prompt + len(turn) + len(suffix) + len(last))
    self.assertEqual(episode.roles, ["prompt"] * n_prompt + ["assistant"] * len(turn)
                     + ["tool"] * len(suffix) + ["assistant"] * len(last))
    self.assertEqual(episode.loss_mask(), episode.role_mask("assistant"))
    self.assertEqual(sum(episode.loss_mask()), len(turn) + len(last))
    self.assertEqual(sum(episode.role_mask("tool")), len(suffix))
    self.assertEqual(episode.logprobs, [0.0] * n_prompt + [-1.0] * len(turn)
                     + [0.0] * len(suffix) + [-2.0] * len(last))
    row = json.loads(json.dumps(episode.as_row()))
    self.assertEqual(row["tokens"], episode.tokens)
    self.assertEqual(row["loss_mask"], episode.loss_mask())
    self.assertEqual(row["behaviour_logprobs"], episode.logprobs)
    self.assertEqual(row["turn_roles"], ["prompt", "assistant", "tool", "assistant"])
    self.assertEqual(row["turn_messages"], [2, 1, 1, 1])
    self.assertEqual(row["turn_tokens"], [n_prompt, len(turn), len(suffix), len(last)])
    self.assertEqual([m["role"] for m in row["messages"]],
                     ["system", "user", "assistant", "tool", "assistant"])
    self.assertEqual((row["num_turns"], row["ended"], row["reward"]), (2, "done", 0.0))
    # The whole conversation: the messages and the tools the opening rendered are what the
    # chat template turns into the row's tokens.
    self.assertEqual(row["tools"], td.CalcEnv().tool_schemas())
    text = r.tokenizer.apply_chat_template(row["messages"], tools=row["tools"], tokenize=False)
    self.assertIn("Tools:", text)
    self.assertEqual(r.encode(text), row["tokens"])

  def test_misuse_refused(self):
    r = renderer("char")
    episode = envs.Episode.start(r, [{"role": "user", "content": "q"}])
    with self.assertRaisesRegex(ValueError, "2 ids but 1 log-probs"):
      episode.add_model_turn([5, 2], [0.0], "a")
    episode.add_model_turn([5, 2], [0.0, 0.0], "a")
    with self.assertRaisesRegex(ValueError, "not another model turn"):
      episode.add_model_turn([5, 2], [0.0, 0.0], "a")
    episode.end("done")
    with self.assertRaisesRegex(ValueError, "has ended"):
      episode.add_env_messages(r, [{"role": "user", "content": "more"}])
    with self.assertRaisesRegex(ValueError, "not one of"):
      episode.end("tired")


class RunEpisodeTest(parameterized.TestCase):

  @parameterized.parameters(("bpe_chatml", "\n"), ("char", ""))
  def test_tokens_are_the_whole_conversation_rendered(self, name, trailer):
    r = renderer(name)
    episode, sampler, env = play(r, [CALL, ANSWER])
    self.assertEqual(episode.ended, "done")
    self.assertEqual([m["role"] for m in episode.messages],
                     ["system", "user", "assistant", "tool", "assistant"])
    self.assertEqual(episode.messages[2]["content"], CALL)  # decoded, without END
    self.assertEqual(episode.messages[3]["content"], "408")
    full = r.render(episode.messages, add_generation_prompt=False)
    self.assertEqual(r.encode(full), episode.tokens + r.encode(trailer))
    # the sampler saw exactly the rendering of the conversation so far, ready for a turn
    self.assertEqual(sampler.seen, [
        r.encode(r.render(episode.messages[:2], add_generation_prompt=True)),
        r.encode(r.render(episode.messages[:4], add_generation_prompt=True))])
    self.assertEqual(episode.turn_lengths,
                     [len(r.encode(CALL)) + 1, len(r.encode(ANSWER)) + 1])
    self.assertEqual(sum(episode.loss_mask()), sum(episode.turn_lengths))
    self.assertTrue(all((lp != 0) == bool(m)
                        for lp, m in zip(episode.logprobs, episode.loss_mask())))
    self.assertEqual((env.steps, env.tool_stats.calls), (2, 1))

  def test_max_turns_drops_the_last_reply(self):
    r = renderer("char")
    episode, _, env = play(r, [CALL], max_turns=2)
    self.assertEqual(episode.ended, "max_turns")
    self.assertEqual(episode.num_turns, 2)
    self.assertEqual([m["role"] for m in episode.messages][2:], ["assistant", "tool", "assistant"])
    self.assertEqual(episode.roles[-1], "assistant")
    self.assertEqual((env.steps, env.tool_stats.calls), (2, 2))  # stepped, reply not appended

  def test_reply_that_does_not_fit_ends_the_episode(self):
    r = renderer("char")
    full, _, _ = play(r, [CALL, ANSWER])
    after_turn = full.parts[0][2] + full.parts[1][2]
    suffix = full.parts[2][2]
    for budget, ended, n in [(after_turn + suffix, "max_episode_tokens", after_turn),
                             (after_turn + suffix + 1, "max_episode_tokens", after_turn + suffix
                              + 1)]:
      episode, _, _ = play(r, [CALL, ANSWER], max_episode_tokens=budget)
      self.assertEqual((episode.ended, len(episode.tokens)), (ended, n))
      self.assertLessEqual(len(episode.tokens), budget)
      self.assertLen(episode.logprobs, len(episode.tokens))
    # with room for one model token only, the answer is cut to it
    self.assertEqual(episode.turn_lengths, [full.turn_lengths[0], 1])
    self.assertEqual(episode.messages[-1], {"role": "assistant", "content": ANSWER[0]})

  def test_model_turn_cut_to_the_budget_without_a_step(self):
    r = renderer("bpe_chatml")
    prompt = len(r.prompt_ids(td.CalcEnv().reset(RECORD)))
    episode, _, env = play(r, [CALL], max_episode_tokens=prompt + 5)
    self.assertEqual((episode.ended, len(episode.tokens), episode.turn_lengths),
                     ("max_episode_tokens", prompt + 5, [5]))
    self.assertEqual(episode.logprobs[-5:], [-0.5, -0.51, -0.52, -0.53, -0.54])
    self.assertEqual(env.steps, 0)

  def test_turn_without_end_of_turn(self):
    r = renderer("char")
    episode, _, env = play(r, [CALL], stop=False)
    self.assertEqual((episode.ended, env.steps), ("max_new_tokens", 0))
    tokenizer = td.bpe_tokenizer(eos_token="<|endoftext|>")
    r = envs.ChatRenderer(tokenizer, end_of_turn="<|im_end|>")
    episode, _, env = play(r, [ANSWER], stop=False, extra=[tokenizer.eos_token_id])
    self.assertEqual((episode.ended, env.steps), ("eos", 0))
    self.assertNotIn("tools", episode.as_row())  # no tools rendered, no tools field

  def test_plain_environment_with_tuples_and_turn_rewards(self):
    class Quiz(envs.Environment):
      def reset(self, record):
        return [{"role": "user", "content": record["prompt"]}]

      def step(self, messages):
        turns = sum(m["role"] == "assistant" for m in messages)
        return [{"role": "user", "content": "Sure?"}], 0.25 * turns, turns == 3

    r = renderer("bpe_chatml")
    episode, _, _ = play(r, ["408", "Yes, 408."], env=Quiz())
    self.assertEqual((episode.ended, episode.turn_rewards), ("done", [0.25, 0.5, 0.75]))
    self.assertEqual(episode.as_row()["reward_parts"], {"env": 1.5})
    self.assertEqual(set(episode.roles), {"prompt", "assistant", "user"})
    full = r.render(episode.messages, add_generation_prompt=False)
    self.assertEqual(r.encode(full), episode.tokens + r.encode("\n"))

  def test_errors_name_where(self):
    class Broken(envs.Environment):
      def reset(self, record):
        return [{"role": "user", "content": "q"}]

      def step(self, messages):
        if len(messages) > 2:
          return [{"role": "tool"}], 0.0, False
        raise ZeroDivisionError("oops")

    r = renderer("char")
    with self.assertRaises(envs.EnvError) as e:
      play(r, [ANSWER], env=Broken())
    self.assertEqual(str(e.exception), "record 7, turn 1: step() raised ZeroDivisionError: oops")
    self.assertIsInstance(e.exception.__cause__, ZeroDivisionError)

    class Malformed(Broken):
      def step(self, messages):
        return [{"role": "tool"}], 0.0, False
    with self.assertRaisesRegex(envs.EnvError, "^record 7, turn 1: step\\(\\) returned message 0 "
                                "with no 'content'"):
      play(r, [ANSWER], env=Malformed())
    with self.assertRaisesRegex(ValueError, "record 7, turn 1: the sampled turn has the "
                                "end-of-turn token 2 at position 1"):
      play(r, ["a<eos>b"])
    with self.assertRaisesRegex(envs.EnvError, "record 7: the opening messages are [0-9]+ "
                                "tokens, which leaves no room within max_episode_tokens = 10"):
      play(r, [ANSWER], max_episode_tokens=10)


if __name__ == "__main__":
  absltest.main()
