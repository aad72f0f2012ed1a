"""Token-exact rendering: suffixes are differences of whole renderings; the probe refuses."""
from absl.testing import absltest
from absl.testing import parameterized

from jaxrl_llm import envs
from jaxrl_llm.data import char_tokenizer
from tests.envs import envs_testdata as td

OPENING = [{"role": "system", "content": "You are a calculator agent."},
           {"role": "user", "content": "What are 12*34 and 5+6?"}]
TURN = {"role": "assistant", "content": "Both. " + td.call("calc", expression="12*34") + " "
        + td.call("calc", expression="5+6")}
REPLY = [{"role": "tool", "content": "408"}, {"role": "tool", "content": "11"}]


def renderers():
  schemas = td.CalcEnv().tool_schemas()
  return {"bpe_chatml": envs.ChatRenderer(td.bpe_tokenizer(), tools=schemas),
          "char": envs.ChatRenderer(td.char_tokenizer_with_tools(), tools=schemas),
          "char_no_tools": envs.ChatRenderer(td.char_tokenizer_with_tools())}


class SuffixTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.renderers = renderers()

  def test_chatml_suffix_starts_after_im_end(self):
    r = self.renderers["bpe_chatml"]
    self.assertEqual(r.end_of_turn, "<|im_end|>")
    self.assertEqual(r.suffix_text(OPENING + [TURN], REPLY), (
        "\n<|im_start|>user\n<tool_response>\n408\n</tool_response>\n<tool_response>\n11\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"))

  def test_char_suffix(self):
    r = self.renderers["char"]
    self.assertEqual(r.suffix_text(OPENING + [TURN], REPLY), " T:408<eos> T:11<eos> A:")
    self.assertEqual(r.suffix_ids(OPENING + [TURN], REPLY)[:4],
                     [4, 4 + ord("T") - 32, 4 + ord(":") - 32, 4 + ord("4") - 32])

  @parameterized.parameters("bpe_chatml", "char", "char_no_tools")
  def test_pieces_equal_the_whole_rendering(self, name):
    r = self.renderers[name]
    turn_ids = r.encode(TURN["content"]) + [r.end_of_turn_id]
    pieces = r.prompt_ids(OPENING) + turn_ids + r.suffix_ids(OPENING + [TURN], REPLY)
    whole = r.render(OPENING + [TURN] + REPLY, add_generation_prompt=True)
    self.assertEqual(pieces, r.encode(whole))
    # and the text difference is exactly what follows the model's end-of-turn token
    head = r.render(OPENING, add_generation_prompt=True) + TURN["content"] + r.end_of_turn
    self.assertEqual(head + r.suffix_text(OPENING + [TURN], REPLY), whole)

  def test_prompt_ids_render_tools_and_generation_prompt(self):
    r = self.renderers["char"]
    text = r.tokenizer.decode(r.prompt_ids(OPENING))
    self.assertStartsWith(text, 'S:You are a calculator agent. Tools: {"type": "function"')
    self.assertEndsWith(text, "<eos> U:What are 12*34 and 5+6?<eos> A:")
    self.assertTrue(all(32 <= ord(c) < 127 for c in text))  # no <unk> for the char tokenizer
    self.assertNotIn(char_tokenizer.UNK_ID, r.prompt_ids(OPENING))

  def test_decode_turn_drops_only_the_final_end_of_turn(self):
    r = self.renderers["bpe_chatml"]
    ids = r.encode("a  b<|im_start|>") + [r.end_of_turn_id]
    self.assertEqual(r.decode_turn(ids), "a  b<|im_start|>")

  def test_suffix_needs_a_model_turn_and_new_messages(self):
    r = self.renderers["char"]
    with self.assertRaisesRegex(ValueError, "must end with the model's turn"):
      r.suffix_text(OPENING, REPLY)
    with self.assertRaisesRegex(ValueError, "new_messages is empty"):
      r.suffix_text(OPENING + [TURN], [])


class ProbeTest(parameterized.TestCase):

  @parameterized.parameters("bpe_chatml", "char", "char_no_tools")
  def test_accepts_chatml_and_the_char_template(self, name):
    renderers()[name].check_template()  # Qwen2.5-like: merges the two tool messages

  @parameterized.named_parameters(
      ("strips_think", lambda: td.bpe_tokenizer(td.THINK_STRIPPING_TEMPLATE),
       "is not append-only.*first difference at character 1[0-9][0-9]: '"),
      ("drops_earlier_turns", lambda: td.bpe_tokenizer(td.DROPPING_TEMPLATE),
       "is not append-only.*first difference at character 1[0-9][0-9]: '<think>"),
      ("no_end_of_turn_after_content", lambda: char_tokenizer.build_char_tokenizer(
          chat_template=char_tokenizer.SIMPLE_CHAT_TEMPLATE),
       "is not append-only.*first difference at character [0-9]+: '<eos>' vs ' T:408"),
      ("merges_across_pieces", lambda: td.bpe_tokenizer(td.SPACE_PROMPT_TEMPLATE),
       "tokenizes the probe conversation differently piecewise.*first difference at token"),
  )
  def test_refuses_with_one_line(self, make_tokenizer, expected):
    tokenizer = make_tokenizer()
    with self.assertRaisesRegex(envs.TemplateError, expected) as e:
      envs.ChatRenderer(tokenizer).check_template()
    self.assertNotIn("\n", str(e.exception))
    self.assertRegex(str(e.exception), f"[Tt]okenizer '{type(tokenizer).__name__}'")

  def test_refusal_is_also_raised_at_run_time(self):
    r = envs.ChatRenderer(td.bpe_tokenizer(td.THINK_STRIPPING_TEMPLATE))
    turn = {"role": "assistant", "content": "<think>hm</think> " + td.call("calc", expression="1")}
    with self.assertRaises(envs.TemplateError):
      r.suffix_ids(OPENING + [turn], REPLY)

  def test_end_of_turn_must_be_one_token(self):
    with self.assertRaisesRegex(envs.TemplateError, "end-of-turn text '<end>' encodes to 5 "
                                "tokens"):
      envs.ChatRenderer(td.char_tokenizer_with_tools(), end_of_turn="<end>")
    tokenizer = char_tokenizer.build_char_tokenizer()
    with self.assertRaisesRegex(envs.TemplateError, "has no chat template"):
      envs.ChatRenderer(tokenizer)

  def test_render_errors_are_one_line(self):
    tokenizer = td.bpe_tokenizer("{{ raise_exception('roles must alternate\nuser/assistant') }}")
    with self.assertRaisesRegex(envs.TemplateError, "cannot render messages \\[system, user\\]: "
                                ".*roles must alternate user/assistant") as e:
      envs.ChatRenderer(tokenizer).check_template()
    self.assertNotIn("\n", str(e.exception))


if __name__ == "__main__":
  absltest.main()
