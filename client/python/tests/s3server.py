"""A real S3-compatible HTTP server for the tests: moto's server (PyPI `moto[server]`),
installed into a virtual environment under build/ the first time it is needed and
started on 127.0.0.1 with signature checking on.

moto checks every request's SigV4 signature against the keys of its IAM users once
authentication is switched on (/moto-api/reset-auth), so the tests first create a user
with an access key and an s3:* policy, the bucket and its objects (unauthenticated
requests, with boto3 from the same environment), then switch it on. From then on a
wrong secret is answered 403 SignatureDoesNotMatch, as AWS answers it.
"""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import support

VENV = os.path.join(support.REPO, "build", "s3venv")
MOTO_SPEC = "moto[server]>=5,<6"


def _venv_python():
    return os.path.join(VENV, "bin", "python")


def ensure_installed():
    """The path of moto_server, installing it when missing; None (with the reason as
    second value) when it cannot be installed here (no network, no venv module)."""
    server = os.path.join(VENV, "bin", "moto_server")
    if os.path.exists(server):
        return server, None
    try:
        if not os.path.exists(_venv_python()):
            subprocess.run(["/usr/bin/python3", "-m", "venv", VENV], check=True, capture_output=True, timeout=120)
        p = subprocess.run([_venv_python(), "-m", "pip", "install", "-q", MOTO_SPEC], capture_output=True, text=True,
                           timeout=600)
        if p.returncode != 0:
            return None, "pip install %s failed: %s" % (MOTO_SPEC, (p.stderr or p.stdout).strip()[-400:])
    except (OSError, subprocess.SubprocessError) as e:
        return None, "cannot make the virtual environment %s: %s" % (VENV, e)
    return (server, None) if os.path.exists(server) else (None, "moto_server missing after pip install")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


_SETUP = r"""
import json, sys
import boto3
ep, bucket, spec = sys.argv[1], sys.argv[2], json.load(sys.stdin)
kw = dict(endpoint_url=ep, region_name="us-east-1", aws_access_key_id="setup", aws_secret_access_key="setup")
iam = boto3.client("iam", **kw)
iam.create_user(UserName="loaderd")
key = iam.create_access_key(UserName="loaderd")["AccessKey"]
iam.put_user_policy(UserName="loaderd", PolicyName="s3", PolicyDocument=json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
s3 = boto3.client("s3", **kw)
s3.create_bucket(Bucket=bucket)
for k, path in spec:
    with open(path, "rb") as f:
        s3.put_object(Bucket=bucket, Key=k, Body=f.read())
print(json.dumps({"id": key["AccessKeyId"], "secret": key["SecretAccessKey"]}))
"""

_UPDATE = r"""
import json, sys
import boto3
ep, bucket, key_id, secret = sys.argv[1:5]
s3 = boto3.client("s3", endpoint_url=ep, region_name="us-east-1", aws_access_key_id=key_id,
                  aws_secret_access_key=secret)
for key, path in json.load(sys.stdin):
    if path is None:
        s3.delete_object(Bucket=bucket, Key=key)
    else:
        with open(path, "rb") as f:
            s3.put_object(Bucket=bucket, Key=key, Body=f.read())
"""

_DELETE = r"""
import sys
import boto3
ep, bucket, key_id, secret, key = sys.argv[1:6]
boto3.client("s3", endpoint_url=ep, region_name="us-east-1", aws_access_key_id=key_id,
             aws_secret_access_key=secret).delete_object(Bucket=bucket, Key=key)
"""


class Server:
    """moto_server on a free port of 127.0.0.1; `objects` maps keys to local files."""

    def __init__(self, binary, bucket, objects, log_path):
        self.bucket = bucket
        self.port = free_port()
        self.endpoint = "http://127.0.0.1:%d" % self.port
        logf = open(log_path, "wb")
        self.proc = subprocess.Popen([binary, "-H", "127.0.0.1", "-p", str(self.port)], stdout=logf,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        logf.close()
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=2).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("moto_server did not start: see %s" % log_path)
                time.sleep(0.1)
        p = subprocess.run([_venv_python(), "-c", _SETUP, self.endpoint, bucket], input=json.dumps(sorted(objects.items())),
                           capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            self.stop()
            raise RuntimeError("setting up the bucket failed:\n" + p.stderr[-2000:])
        keys = json.loads(p.stdout)
        self.key_id, self.secret = keys["id"], keys["secret"]
        # From here on, every request must be signed with the user's key.
        req = urllib.request.Request(self.endpoint + "/moto-api/reset-auth", data=b"0", method="POST",
                                     headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(req, timeout=10).read()

    def delete(self, key):
        subprocess.run([_venv_python(), "-c", _DELETE, self.endpoint, self.bucket, self.key_id, self.secret, key],
                       check=True, capture_output=True, timeout=60)

    def update(self, changes):
        """Writes each object of `changes` (key -> a local file's path) with that file's
        bytes, or deletes it (key -> None), in one go."""
        subprocess.run([_venv_python(), "-c", _UPDATE, self.endpoint, self.bucket, self.key_id, self.secret],
                       input=json.dumps(sorted(changes.items())), text=True, check=True, capture_output=True,
                       timeout=60)

    def credentials_file(self, path, profile="loaderd-test"):
        with open(path, "w") as f:
            f.write("# written by the tests\n[other]\naws_access_key_id = AKIAOTHER\naws_secret_access_key = nope\n\n"
                    "[%s]\naws_access_key_id = %s\naws_secret_access_key = %s\n" % (profile, self.key_id, self.secret))
        os.chmod(path, 0o600)
        return profile

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


if __name__ == "__main__":   # `python3 s3server.py`: install only
    path, why = ensure_installed()
    print(path or why)
    sys.exit(0 if path else 1)
