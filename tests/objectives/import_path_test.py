"""jaxrl_llm.import_path.load_function (used for user estimators and reducers)."""
import os
import os.path
import tempfile

from absl.testing import absltest

from jaxrl_llm import import_path


class LoadFunctionTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.tmp = self.create_tempdir().full_path
    self.path = os.path.join(self.tmp, "user_fns.py")
    with open(self.path, "w") as f:
      f.write("def triple(x):\n  return 3 * x\n\nNOT_A_FUNCTION = 7\n\n"
              "class Box:\n  @staticmethod\n  def open(x):\n    return x + 1\n")

  def test_module_path(self):
    self.assertIs(import_path.load_function("os.path:join"), os.path.join)

  def test_file_path(self):
    self.assertEqual(import_path.load_function(f"{self.path}:triple")(2), 6)
    self.assertEqual(import_path.load_function(f"{self.path}:Box.open")(2), 3)

  def test_relative_file_path(self):
    cwd = os.getcwd()
    try:
      os.chdir(self.tmp)
      self.assertEqual(import_path.load_function("./user_fns.py:triple")(1), 3)
    finally:
      os.chdir(cwd)

  def test_errors(self):
    cases = (
        ("no_colon_here", ValueError, "must look like"),
        ("os.path:", ValueError, "must look like"),
        ("no_such_module_xyz:f", ModuleNotFoundError, "no_such_module_xyz"),
        (os.path.join(tempfile.gettempdir(), "nope_xyz.py:f"), FileNotFoundError, "does not exist"),
        ("os.path:no_such_fn", AttributeError, "has no attribute 'no_such_fn'"),
        (f"{self.path}:NOT_A_FUNCTION", TypeError, "names an object of type int, not a function"),
    )
    for spec, error, pattern in cases:
      with self.subTest(spec), self.assertRaisesRegex(error, pattern):
        import_path.load_function(spec)


if __name__ == "__main__":
  absltest.main()
