"""The SSE client of test/clients, as the openai and anthropic Python SDKs read a
stream: httpx (proxy and CA from the environment), a POST whose response is read
line by line. One JSON line per event, with the time it was read (Unix ns).

    sse_client.py URL
"""
import json
import sys
import time

import httpx

with httpx.Client(timeout=20) as client:
    with client.stream("POST", sys.argv[1], json={"stream": True}) as r:
        print(json.dumps({"status": r.status_code, "http_version": r.http_version}), flush=True)
        for line in r.iter_lines():
            at = time.time_ns()
            line = line.rstrip("\r\n")  # httpx 0.23 keeps the line ending
            if line.startswith("data: "):
                print(json.dumps({"data": line[6:], "at": at}), flush=True)
