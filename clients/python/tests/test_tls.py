"""The client against a live server over TLS (HTTP/1.1 here; the server also speaks HTTP/2): a
private CA trusted through ca_file, and refused, once, without it. The certificates are made with
openssl (SHARDSRV_BIN points at the server binary; default bin/shardsrv)."""

import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import shardsrv  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class TLS(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.tmp.name
        cls.ca = os.path.join(d, "ca.pem")
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
                "-subj", "/CN=test CA", "-keyout", os.path.join(d, "ca.key"), "-out", cls.ca)
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=shardsrv",
                "-keyout", os.path.join(d, "tls.key"), "-out", os.path.join(d, "tls.csr"))
        with open(os.path.join(d, "san.cnf"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1\n")
        openssl("x509", "-req", "-in", os.path.join(d, "tls.csr"), "-CA", cls.ca, "-CAkey", os.path.join(d, "ca.key"),
                "-CAcreateserial", "-days", "1", "-extfile", os.path.join(d, "san.cnf"),
                "-out", os.path.join(d, "tls.crt"))
        binary = os.environ.get("SHARDSRV_BIN", os.path.join(ROOT, "bin", "shardsrv"))
        ckdir = os.path.join(d, "checkpoints")
        subprocess.run([binary, "example", "--out", ckdir], check=True, stdout=subprocess.DEVNULL)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cls.proc = subprocess.Popen([binary, "serve", "--store", ckdir, "--addr", f"127.0.0.1:{port}", "--log-level",
                                     "warn", "--tls-cert-file", os.path.join(d, "tls.crt"),
                                     "--tls-key-file", os.path.join(d, "tls.key")])
        cls.url = f"https://127.0.0.1:{port}"
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)

    @classmethod
    def tearDownClass(cls):
        cls.proc.terminate()
        cls.proc.wait(timeout=30)
        cls.tmp.cleanup()

    def test_a_private_ca_through_ca_file(self):
        c = shardsrv.Client(self.url, ca_file=self.ca, attempts=2, backoff=0.05)
        self.assertIn("qwen2-moe-tiny", c.checkpoints())
        layout = {"engine": "vllm", "tensor_parallel_size": 2, "tp_rank": 1}
        data, digest = c.fetch_verified({"checkpoint": "qwen2-moe-tiny", "layout": layout})
        self.assertTrue(digest.startswith("sha-256=:"))
        self.assertGreater(len(data), 0)

    def test_an_unknown_ca_is_refused_once(self):
        c = shardsrv.Client(self.url, attempts=5, backoff=60)  # a retry would hang the test
        with self.assertNoLogs("shardsrv", "WARNING"), self.assertRaises(urllib.error.URLError) as ctx:
            c.checkpoints()
        self.assertIsInstance(ctx.exception.reason, ssl.SSLCertVerificationError)


if __name__ == "__main__":
    unittest.main()
