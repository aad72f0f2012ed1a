"""`paths`: the same file operations on local paths and on gs:// (a local GCS emulator)."""
import os
import subprocess
import sys
import textwrap
from unittest import mock

from absl.testing import absltest

from jaxrl_llm import paths
from jaxrl_llm.data import jsonl
from jaxrl_llm.models import load
from jaxrl_llm import config as config_lib
from tests import gcs_emulator


class LocalPathsTest(absltest.TestCase):

  def test_write_atomic_replaces_and_leaves_no_temporary_file(self):
    d = self.create_tempdir().full_path
    path = paths.join(d, "config.json")
    paths.write_atomic(path, "old")
    paths.write_atomic(path, "new")
    self.assertEqual(paths.read_text(path), "new")
    self.assertEqual(os.listdir(d), ["config.json"])

  def test_append_adds_to_the_end(self):
    path = os.path.join(self.create_tempdir().full_path, "metrics.jsonl")
    paths.append(path, "1\n")
    paths.append(path, "2\n")
    self.assertEqual(paths.read_text(path), "1\n2\n")

  def test_local_paths_are_left_as_they_are(self):
    d = self.create_tempdir().full_path
    self.assertFalse(paths.is_remote(d))
    self.assertEqual(paths.local_copy(d), d)
    self.assertEqual(paths.join("a", "b"), os.path.join("a", "b"))
    self.assertEqual(paths.absolute("a"), os.path.abspath("a"))
    with paths.local_staging(os.path.join(d, "new")) as stage:
      self.assertEqual(stage, os.path.join(d, "new"))
      self.assertTrue(os.path.isdir(stage))

  def test_other_url_schemes_are_rejected_by_name(self):
    with self.assertRaisesRegex(ValueError, r"'s3://bucket/run': unsupported URL scheme"):
      paths.exists("s3://bucket/run")

  def test_append_mode_is_refused(self):
    with self.assertRaisesRegex(ValueError, "use append"):
      paths.open(os.path.join(self.create_tempdir().full_path, "x"), "a")

  def test_gs_backend_is_gcsfs_even_where_tensorflow_is_installed(self):
    # epath would pick tf.io.gfile whenever `import tensorflow` can be found.
    fake_site = self.create_tempdir().full_path
    os.makedirs(os.path.join(fake_site, "tensorflow"))
    open(os.path.join(fake_site, "tensorflow", "__init__.py"), "w").close()
    code = textwrap.dedent("""
        import importlib.util, os
        from jaxrl_llm import paths
        from etils.epath import backend
        assert importlib.util.find_spec("tensorflow") is not None
        assert "EPATH_USE_TF" not in os.environ  # importing changes no environment variable
        print(paths._epath("gs://bucket/run")._backend is backend.fsspec_backend)
    """)
    env = {k: v for k, v in os.environ.items() if k != "EPATH_USE_TF"}
    env["PYTHONPATH"] = os.pathsep.join([fake_site, os.getcwd()])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    self.assertEqual(out.stdout.strip(), "True", out.stderr)

  def test_gs_without_gcsfs_names_the_extra(self):
    with mock.patch.dict(sys.modules, {"gcsfs": None}):
      with self.assertRaisesRegex(ImportError, r"'gs://b/x'.*jaxrl_llm\[gcs\]"):
        paths.exists("gs://b/x")


class GcsPathsTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    gcs_emulator.start()
    cls.root = f"gs://{gcs_emulator.BUCKET}/paths_test"

  def test_write_read_list_remove(self):
    d = paths.join(self.root, "files")
    path = paths.join(d, "a.txt")
    self.assertFalse(paths.exists(path))
    paths.write_atomic(path, "text")
    paths.write_atomic(paths.join(d, "b.bin"), b"\x00\x01")
    self.assertTrue(paths.isfile(path))
    self.assertTrue(paths.isdir(d))
    self.assertEqual(paths.read_text(path), "text")
    self.assertEqual(sorted(paths.listdir(d)), ["a.txt", "b.bin"])
    paths.remove(path)
    self.assertFalse(paths.exists(path))

  def test_append_composes_onto_the_object(self):
    path = paths.join(self.root, "log", "metrics.jsonl")
    for i in range(3):
      paths.append(path, f"{i}\n")
    self.assertEqual(paths.read_text(path), "0\n1\n2\n")
    self.assertEqual(paths.listdir(paths.join(self.root, "log")), ["metrics.jsonl"])

  def test_local_staging_uploads_every_file(self):
    d = paths.join(self.root, "staged")
    with paths.local_staging(d) as stage:
      for name in ("x.json", "y.txt"):
        with open(os.path.join(stage, name), "w") as f:
          f.write(name)
    self.assertEqual(sorted(paths.listdir(d)), ["x.json", "y.txt"])
    self.assertEqual(paths.read_text(paths.join(d, "y.txt")), "y.txt")

  def test_local_copy_is_reused_until_the_directory_changes(self):
    d = paths.join(self.root, "model")
    paths.write_atomic(paths.join(d, "config.json"), "{}")
    paths.write_atomic(paths.join(d, "weights"), b"1234")
    local = paths.local_copy(d)
    self.assertTrue(local.startswith(paths.cache_dir()))
    with open(os.path.join(local, "weights"), "rb") as f:
      self.assertEqual(f.read(), b"1234")
    marker = os.path.join(local, "marker")  # survives only while the copy is reused
    open(marker, "w").close()
    self.assertEqual(paths.local_copy(d), local)
    self.assertTrue(os.path.exists(marker))
    paths.write_atomic(paths.join(d, "weights"), b"123456")
    self.assertEqual(paths.local_copy(d), local)
    self.assertFalse(os.path.exists(marker))
    with open(os.path.join(local, "weights"), "rb") as f:
      self.assertEqual(f.read(), b"123456")

  def test_a_missing_bucket_is_named_in_the_error(self):
    workdir = "gs://no-such-bucket-jaxrl/run"
    with self.assertRaisesRegex(ValueError, r"workdir 'gs://no-such-bucket-jaxrl/run' cannot be "
                                "written"):
      config_lib.check_writable(workdir)
    with self.assertRaisesRegex(FileNotFoundError,
                                r"model path 'gs://no-such-bucket-jaxrl/model' does not exist"):
      load.check_model_dir("gs://no-such-bucket-jaxrl/model")
    with self.assertRaisesRegex(FileNotFoundError,
                                r"'gs://no-such-bucket-jaxrl/train.jsonl' does not exist"):
      jsonl.read_jsonl("gs://no-such-bucket-jaxrl/train.jsonl")

  def test_a_missing_prefix_in_a_real_bucket_is_named_in_the_error(self):
    with self.assertRaisesRegex(FileNotFoundError, r"model path '.*/no/model' does not exist"):
      load.check_model_dir(paths.join(self.root, "no", "model"))
    with self.assertRaisesRegex(FileNotFoundError, r"'.*/no/model' does not exist"):
      paths.local_copy(paths.join(self.root, "no", "model"))


if __name__ == "__main__":
  absltest.main()
