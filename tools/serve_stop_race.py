"""Probe serve's stop: 8 threads poll /health while the server gets SIGTERM; counts answers by
status, and lists bodies that were not whole JSON (cut) and connections taken but never answered.

    .venv/bin/python tools/serve_stop_race.py ENGINES PORT

Before session 54, most runs had one answer cut (IncompleteRead: its headers sent, its body not,
as the process ended under the handler thread) or a connection the server took and never
answered (RemoteDisconnected: SIGTERM landed in serve_forever between its accept and handing the
socket on); a reset (ConnectionResetError) is a connection still in the listen queue when the socket
closed, which no server answers."""
import http.client
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

port = int(sys.argv[2])
SPECRT = str(Path(sys.executable).with_name("specrt"))  # (the venv's, beside its python)
p = subprocess.Popen([SPECRT, "serve", sys.argv[1], "--port", str(port)],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
while True:
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/health")
        c.getresponse().read()
        break
    except OSError:
        time.sleep(0.2)
bad, counts, stop = [], {}, False
def hammer():
    while not stop:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health"); r = c.getresponse(); body = r.read()
            try:
                json.loads(body)
            except ValueError:
                bad.append((r.status, body))
            counts[r.status] = counts.get(r.status, 0) + 1
        except http.client.IncompleteRead as e:
            bad.append(("incomplete", repr(e)))
        except (ConnectionRefusedError,):
            return
        except Exception as e:
            counts[type(e).__name__] = counts.get(type(e).__name__, 0) + 1
ts = [threading.Thread(target=hammer) for _ in range(8)]
[t.start() for t in ts]
time.sleep(1.0)
p.send_signal(signal.SIGTERM)
p.wait(30)
stop = True
[t.join() for t in ts]
print(counts, "cut bodies:", bad[:5], len(bad))
sys.exit(1 if bad or counts.get("RemoteDisconnected") else 0)
