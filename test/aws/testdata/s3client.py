"""boto3 as an agent uses it, holding only egressd's placeholder key pair.

usage: s3client.py ENDPOINT BUCKET CASE
CASE put: create the bucket, put objects (a single PUT, one with a trailing
checksum, a multipart upload), get them back; ranged: put a 20 MiB object and
download it as boto3 does above multipart_threshold (ranged GETs); wrong_region, wrong_service: one
call that egressd must refuse. Prints one JSON object: what was sent
(X-Amz-Content-SHA256 per operation) and what came back.
"""
import hashlib
import io
import json
import os
import sys
import tempfile

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import ClientError
from botocore.history import get_global_history_recorder

endpoint, bucket, case = sys.argv[1:4]
sent = []
last = {"partial": 0}


def record(request, **_):
    v = request.headers.get("X-Amz-Content-SHA256", "")
    sent.append(v.decode() if isinstance(v, bytes) else v)


class LastResponse:
    """Keeps the last HTTP response's status and Egressd-Reason, before any parsing."""

    def emit(self, event_type, payload, source):
        if event_type == "HTTP_RESPONSE":
            last["status"] = payload["status_code"]
            last["reason"] = payload["headers"].get("egressd-reason", "")
            last["partial"] += payload["status_code"] == 206


recorder = get_global_history_recorder()
recorder.enable()
recorder.add_handler(LastResponse())


def client(service="s3", region="us-east-1"):
    c = boto3.session.Session().client(service, endpoint_url=endpoint, region_name=region,
                                       config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
    c.meta.events.register("before-send", record)
    return c


def refused(call):
    """The refusal as the client received it: egressd's JSON body is no XML an SDK
    parses, so the status and Egressd-Reason are read before parsing."""
    try:
        call()
    except Exception as e:  # ClientError, or the parser's error on egressd's JSON body
        return {"status": last.get("status", 0), "reason": last.get("reason", ""), "error": type(e).__name__}
    return {"status": 200}


def put():
    s3 = client()
    try:
        s3.create_bucket(Bucket=bucket)
    except ClientError as e:
        if e.response["Error"]["Code"] != "BucketAlreadyOwnedByYou":
            raise
    bodies = {"single": b"hello from the sandbox\n", "trailer": b"checksummed " * 1000,
              "multi": b"a" * (5 << 20) + b"tail"}
    s3.put_object(Bucket=bucket, Key="single", Body=bodies["single"])
    s3.put_object(Bucket=bucket, Key="trailer", Body=bodies["trailer"], ChecksumAlgorithm="CRC32")
    up = s3.create_multipart_upload(Bucket=bucket, Key="multi")
    parts = []
    for n, chunk in ((1, bodies["multi"][:5 << 20]), (2, bodies["multi"][5 << 20:])):
        r = s3.upload_part(Bucket=bucket, Key="multi", UploadId=up["UploadId"], PartNumber=n, Body=chunk)
        parts.append({"PartNumber": n, "ETag": r["ETag"]})
    s3.complete_multipart_upload(Bucket=bucket, Key="multi", UploadId=up["UploadId"],
                                 MultipartUpload={"Parts": parts})
    got = {}
    for key, body in bodies.items():
        data = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        got[key] = hashlib.sha256(data).hexdigest() == hashlib.sha256(body).hexdigest()
    return {"got": got}


def ranged():
    s3 = client()
    body = os.urandom(20 << 20)
    cfg = TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20)
    s3.upload_fileobj(io.BytesIO(body), bucket, "ranged", Config=cfg)
    with tempfile.TemporaryDirectory() as d:
        s3.download_file(bucket, "ranged", d + "/ranged", Config=cfg)
        with open(d + "/ranged", "rb") as f:
            data = f.read()
    return {"got": {"ranged": hashlib.sha256(data).digest() == hashlib.sha256(body).digest()},
            "partial": last["partial"]}


cases = {
    "put": put,
    "ranged": ranged,
    "wrong_region": lambda: refused(lambda: client(region="eu-west-1").list_objects_v2(Bucket=bucket)),
    "wrong_service": lambda: refused(lambda: client("sqs").list_queues()),
}
out = cases[case]()
out["sent"] = sent
print(json.dumps(out))
