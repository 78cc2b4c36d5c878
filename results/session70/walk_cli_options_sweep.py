"""w70d: every specrt option at its edges. Each case runs `specrt ...` in a subprocess (SPECRT_THP=0,
nice 10, a timeout), recording exit code, traceback, first stderr line. Usage:
    sweep.py GROUP [GROUP...]     (groups: see CASES keys) -> /tmp/w70d-sweep/<group>.jsonl"""
import json, os, shutil, signal, subprocess, sys, time
from pathlib import Path

SPECRT = "/tmp/w70d/.venv/bin/specrt"
T = "/tmp/w70d-t"; E = f"{T}/engines"; X = f"{T}/export"; P = f"{T}/prompts.jsonl"
RE = "/tmp/w70d-e"; RX = "/tmp/w70d-x"
O = "/tmp/w70d-o"
REF = "/tmp/w70d/tests/data/speculators-peagle-tiny"
BIG = str(2**63); HUGE = "1" + "0" * 30
RUN = ["run", E, "--prompts", P, "--max-new-tokens", "2", "--quiet"]
RUN1 = ["run", E, "--prompts", P, "--max-new-tokens", "2", "--quiet", "--governor", "fixed:1"]

def c(name, args, expect="err", stdin=None, timeout=180, serve=False):
    return dict(name=name, args=args, expect=expect, stdin=stdin, timeout=timeout, serve=serve)

CASES = {}
CASES["run"] = [
    *[c(f"run --max-new-tokens {v!r}", [*RUN1[:5], v, "--quiet", "--governor", "fixed:1"], e) for v, e in
      (("0", "err"), ("-1", "err"), ("1", "ok"), (BIG, "ok"), (HUGE, "ok"), ("1e18", "err"), ("nan", "err"), ("", "err"),
       (" ", "err"), ("2 ", "?"), ("2\n", "?"), ("-0", "err"), ("٢", "?"), ("+2", "?"))],
    *[c(f"run --temperature {v!r}", [*RUN1, "--temperature", v, "--seed", "1"], e) for v, e in
      (("-0", "ok"), ("nan", "err"), ("inf", "err"), ("-inf", "err"), ("-1", "err"), ("1e308", "ok"), ("1e-320", "ok"),
       ("", "err"), ("1e400", "err"), ("0.5 ", "?"), ("1_0", "?"))],
    *[c(f"run --top-p {v!r}", [*RUN1, "--temperature", "1", "--top-p", v, "--seed", "1"], e) for v, e in
      (("0", "err"), ("-0", "err"), ("1", "ok"), ("1.0000001", "err"), ("nan", "err"), ("1e-320", "ok"), ("inf", "err"))],
    *[c(f"run --top-k {v!r}", [*RUN1, "--temperature", "1", "--top-k", v, "--seed", "1"], e) for v, e in
      (("-2", "err"), ("-1", "ok"), ("0", "ok"), ("1", "ok"), (BIG, "ok"), (HUGE, "ok"), ("1.5", "err"))],
    *[c(f"run --seed {v!r}", [*RUN1, "--temperature", "1", "--seed", v], e) for v, e in
      (("-2", "err"), ("-1", "ok"), ("0", "ok"), (BIG, "ok"), (str(2**64), "ok"), (HUGE, "ok"), ("1e3", "err"))],
    *[c(f"run --seed {v!r} --reproducible", [*RUN1, "--temperature", "1", "--reproducible", "--seed", v], e) for v, e in
      ((BIG, "ok"), (HUGE, "ok"))],
    c("run --top-p 0.5 greedy", [*RUN1, "--top-p", "0.5"], "ok"),
    c("run --reproducible greedy", [*RUN1, "--reproducible"], "ok"),
    *[c(f"run --logprobs {v!r}", [*RUN1, "--logprobs", v, "--stats", f"{O}/lp{v}.json"], e) for v, e in
      (("-1", "err"), ("0", "ok"), ("20", "ok"), ("21", "err"))],
    c("run --logprobs no stats", [*RUN1, "--logprobs", "3"]),
    *[c(f"run --governor {v!r}", [*RUN, "--governor", v], e) for v, e in
      (("", "err"), (" ", "err"), ("fixed:0", "?"), ("fixed:-1", "err"), ("fixed:1", "ok"), ("fixed:3", "err"),
       ("fixed:" + HUGE, "err"), ("fixed:2 ", "?"), ("fixed: 2", "?"), ("FIXED:2", "?"), ("fixed:²", "err"),
       ("fixed:٢", "?"), ("fixed:2:tree=0", "err"), ("fixed:2:tree=1", "ok"), ("fixed:2:tree=" + HUGE, "err"),
       ("dspark:block=0", "err"), ("dspark:block=3", "err"), ("dspark:block=2", "ok"), ("off:ngram=0", "err"),
       ("off:ngram=-1", "err"), ("off:ngram=" + HUGE, "?"), ("off:grow=0", "err"), ("off:grow=" + HUGE, "?"),
       ("off:ngram:ngram", "err"), ("0", "ok"), ("-1", "err"), ("2", "ok"), ("3", "err"), ("adaptive:tree=2", "ok"),
       ("off:tree=2", "err"), ("off:corpus", "err"), ("auto:ngram", "?"), ("dspark:profiled:profiled", "err"),
       ("dspark:block=2:block=1", "err"), ("fixed:1:ngram=2", "ok"), ("nan", "err"), ("fixed:nan", "err"),
       ("fixed:1e0", "err"), ("fixed:01", "?"), ("adaptive", "ok"), ("dspark", "ok"), ("dspark:", "err"),
       (":ngram", "err"), ("fixed:", "err"), ("fixed:2:", "err"))],
    c("run --stop ''", [*RUN1, "--stop", ""]),
    c("run --stop with no tokenizer", [*RUN1, "--stop", "x"]),
    c("run --prompt ''", ["run", E, "--prompt", "", "--max-new-tokens", "2", "--governor", "fixed:1"]),
    c("run --prompt x (no tokenizer)", ["run", E, "--prompt", "x", "--max-new-tokens", "2", "--governor", "fixed:1"]),
    c("run --prompt twice", ["run", E, "--prompt", "a", "--prompt", "b", "--max-new-tokens", "2"]),
    c("run --prompts empty", ["run", E, "--prompts", f"{O}/empty.jsonl", "--max-new-tokens", "2"]),
    c("run --prompts blank lines", ["run", E, "--prompts", f"{O}/blank.jsonl", "--max-new-tokens", "2"]),
    c("run --prompts binary", ["run", E, "--prompts", f"{O}/binary.jsonl", "--max-new-tokens", "2"]),
    c("run --prompts BOM", ["run", E, "--prompts", f"{O}/bom.jsonl", "--max-new-tokens", "2", "--quiet"], "ok"),
    c("run --prompts ids big", ["run", E, "--prompts", f"{O}/bigid.jsonl", "--max-new-tokens", "2"]),
    c("run --prompts ids float", ["run", E, "--prompts", f"{O}/floatid.jsonl", "--max-new-tokens", "2"]),
    c("run --prompts ids neg", ["run", E, "--prompts", f"{O}/negid.jsonl", "--max-new-tokens", "2"]),
    c("run --prompts ids empty", ["run", E, "--prompts", f"{O}/emptyid.jsonl", "--max-new-tokens", "2"]),
    c("run --prompts ids bool", ["run", E, "--prompts", f"{O}/boolid.jsonl", "--max-new-tokens", "2"]),
    c("run --prompts ids 60 (near ctx 64)", ["run", E, "--prompts", f"{O}/long60.jsonl", "--max-new-tokens", "10", "--quiet", "--governor", "fixed:2"], "ok"),
    c("run --prompts ids 64 (=ctx)", ["run", E, "--prompts", f"{O}/long64.jsonl", "--max-new-tokens", "10"]),
    c("run --prompts -", ["run", E, "--prompts", "-", "--max-new-tokens", "2"], "?", stdin='{"prompt_ids":[5,6,7]}\n'),
    c("run --prompts folder", ["run", E, "--prompts", T]),
    c("run --stats -", [*RUN1, "--stats", "-"], "?"),
    c("run --stats folder", [*RUN1, "--stats", T]),
    c("run --stats no parent", [*RUN1, "--stats", "/nonexistent/x/s.json"], "?"),
    c("run --stats spaces", [*RUN1, "--stats", f"{O}/a b/s t.json"], "ok"),
    c("run --stats file-parent", [*RUN1, "--stats", f"{P}/s.json"]),
    c("run --stats = prompts", [*RUN1, "--stats", P]),
    c("run --stats engines.json", [*RUN1, "--stats", f"{E}/engines.json"]),
    c("run --grow-file folder", [*RUN1, "--grow-file", T]),
    c("run --grow-file is prompts", [*RUN1, "--grow-file", P]),
    c("run --grow-file garbage", [*RUN1, "--grow-file", f"{O}/garbage.npz"]),
    c("run --grow-file = stats", [*RUN1, "--grow-file", f"{O}/gs.json", "--stats", f"{O}/gs.json"]),
    c("run --chat ids", [*RUN1, "--chat"], "ok"),
    c("run --chat-template-kwargs ''", [*RUN1, "--chat-template-kwargs", ""]),
    c("run --chat-template-kwargs []", [*RUN1, "--chat-template-kwargs", "[]"]),
    c("run --chat-template-kwargs null", [*RUN1, "--chat-template-kwargs", "null"]),
    c("run --chat-template-kwargs NaN", [*RUN1, "--chat-template-kwargs", '{"a": NaN}'], "?"),
    c("run --chat-template-kwargs bad", [*RUN1, "--chat-template-kwargs", "{bad"]),
    c("run --chat-template-kwargs {}", [*RUN1, "--chat-template-kwargs", "{}"], "ok"),
    c("run ENGINES=export", ["run", X, "--prompt", "x"]),
    c("run ENGINES=file", ["run", P, "--prompt", "x"]),
    c("run ENGINES=-dash", ["run", "--", "-x", "--prompt", "x"]),
    c("run --max-new-tokens twice", ["run", E, "--prompts", P, "--max-new-tokens", "0", "--max-new-tokens", "1",
                                     "--quiet", "--governor", "fixed:1"], "ok"),
]
CASES["build"] = [
    *[c(f"build --depths {v!r}", ["build", X, "-o", f"{O}/b{i}", "--depths", v, "--profile-repeats", "1", "--no-canary"], e)
      for i, (v, e) in enumerate((("", "err"), (",", "err"), ("0", "err"), ("-1", "err"), ("1,1", "?"), ("2,1", "?"),
                                  ("65", "err"), ("9999999999999999999", "err"), ("1, 2", "?"), (" 1", "?"), ("١", "?"),
                                  ("1,,2", "?"), ("1.0", "err"), ("1-2", "err"), ("0,1", "err")))],
    *[c(f"build --max-context {v!r}", ["build", X, "-o", f"{O}/mc{i}", "--depths", "1", "--max-context", v,
                                         "--profile-repeats", "1", "--no-canary"], e)
      for i, (v, e) in enumerate((("0", "err"), ("-1", "err"), ("1", "err"), ("2", "?"), ("3", "?"), ("8", "?"),
                                  (BIG, "err"), (HUGE, "err"), ("2147483648", "err"), ("nan", "err"), ("", "err")))],
    *[c(f"build --precision {v!r}", ["build", X, "-o", f"{O}/pr{i}", "--depths", "1", "--precision", v,
                                       "--profile-repeats", "1", "--no-canary"], e)
      for i, (v, e) in enumerate((("", "err"), ("fp64", "err"), ("FP32", "?"), ("fp32 ", "?"), ("fp32", "ok"),
                                  ("fp16", "?"), ("float32", "?")))],
    *[c(f"build --threads {v!r}", ["build", X, "-o", f"{O}/th{i}", "--depths", "1", "--threads", v,
                                     "--profile-repeats", "1", "--no-canary"], e)
      for i, (v, e) in enumerate((("0", "err"), ("-1", "err"), ("1", "ok")))],
    c("build --profile-repeats 0", ["build", X, "-o", f"{O}/r0", "--profile-repeats", "0"]),
    c("build --backend tensorrt", ["build", X, "-o", f"{O}/trt", "--backend", "tensorrt", "--depths", "1"]),
    c("build --sessions per-depth --backend tensorrt", ["build", X, "-o", f"{O}/trt2", "--backend", "tensorrt", "--sessions", "per-depth"]),
    c("build --trt-layout engines (ort)", ["build", X, "-o", f"{O}/tl", "--trt-layout", "engines"]),
    c("build --target-head screened (tiny)", ["build", X, "-o", f"{O}/sh", "--depths", "1", "--target-head", "screened",
                                              "--profile-repeats", "1", "--no-canary"], "?"),
    c("build -o existing file", ["build", X, "-o", P]),
    c("build -o = export", ["build", X, "-o", X, "--force"]),
    c("build -o inside export", ["build", X, "-o", f"{X}/eng", "--depths", "1", "--profile-repeats", "1", "--no-canary"], "?"),
    c("build EXPORT=engines", ["build", E, "-o", f"{O}/be"]),
    c("build EXPORT=checkpoint", ["build", f"{REF}/verifier", "-o", f"{O}/bc"]),
    c("build -o spaces", ["build", X, "-o", f"{O}/sp ace/e ng", "--depths", "1", "--profile-repeats", "1", "--no-canary"], "ok"),
    c("build -o -dash", ["build", X, "-o", "-dash", "--depths", "1"], "?"),
]
CASES["export"] = [
    *[c(f"export --dtype {v!r}", ["export", f"{REF}/verifier", "-o", f"{O}/x{i}", "--dtype", v], e)
      for i, (v, e) in enumerate((("", "err"), ("float64", "err"), ("FLOAT32", "?"), ("float32 ", "?"), ("fp16", "?"),
                                  ("int8", "err")))],
    c("export TARGET=file", ["export", f"{REF}/verifier/config.json", "-o", f"{O}/xf"]),
    c("export --draft=target", ["export", f"{REF}/verifier", "--draft", f"{REF}/verifier", "-o", f"{O}/xd"]),
    c("export -o = target --force", ["export", f"{REF}/verifier", "-o", f"{REF}/verifier", "--force"]),
    c("export -o inside target", ["export", f"{REF}/verifier", "-o", f"{REF}/verifier/out"]),
    c("export -o existing", ["export", f"{REF}/verifier", "-o", X]),
    c("export -o parent of target --force", ["export", f"{REF}/verifier", "-o", REF, "--force"]),
    c("export --draft-aux-ids w/o draft", ["export", f"{REF}/verifier", "-o", f"{O}/xa", "--draft-aux-ids", "layer-input"]),
    c("export --draft-embeddings default explicit w/o draft", ["export", f"{REF}/verifier", "-o", f"{O}/xe", "--draft-embeddings", "own"]),
    c("export TARGET=export", ["export", X, "-o", f"{O}/xx"]),
    c("export TARGET=engines", ["export", E, "-o", f"{O}/xy"]),
]
CASES["misc"] = [
    *[c(f"corpus --nmin {a} --nmax {b}", ["corpus", E, f"{O}/answers.jsonl", "--nmin", a, "--nmax", b], e)
      for a, b, e in (("0", "8", "err"), ("1", "1", "?"), (BIG, BIG, "err"), ("9", "8", "err"), ("1", BIG, "err"),
                      ("3", "-1", "err"))],
    c("corpus empty answers", ["corpus", E, f"{O}/empty.jsonl"]),
    c("corpus answers = engines.json", ["corpus", E, f"{E}/engines.json"]),
    c("corpus no answers", ["corpus", E]),
    *[c(f"profile --repeats {v}", ["profile", E, "--repeats", v], e) for v, e in (("0", "err"), ("-1", "err"), ("x", "err"))],
    c("canary export folder", ["canary", X]),
    *[c(f"compare --prompt-tokens {v!r}", ["compare", E, "--prompt-tokens", v], e) for v, e in
      (("0", "err"), ("-1", "err"), ("1", "ok"), ("63", "?"), ("64", "err"), ("65", "err"), (BIG, "err"), (HUGE, "err"))],
    *[c(f"compare --atol {v!r}", ["compare", E, "--prompt-tokens", "4", "--atol", v], e) for v, e in
      (("nan", "err"), ("-1", "err"), ("logits:", "err"), (":1", "?"), ("nosuch:1", "?"), ("1e-3 ", "?"), ("inf", "err"),
       ("", "err"), ("-0", "?"))],
    c("compare --rtol 1e400", ["compare", E, "--prompt-tokens", "4", "--rtol", "1e400"]),
    c("compare --reference torch no target", ["compare", E, "--reference", "torch", "--prompt-tokens", "4"], "?"),
    c("compare --report = --save-inputs", ["compare", E, "--report", f"{O}/r.json", "--save-inputs", f"{O}/r.json"]),
    *[c(f"calibrate --max-new-tokens {v!r}", ["calibrate", E, "--prompts", P, "--max-new-tokens", v, "--report", f"{O}/cal{i}.json"], e)
      for i, (v, e) in enumerate((("0", "err"), ("-1", "err"), ("2", "err"), ("3", "ok"), (BIG, "?"), (HUGE, "?"), ("", "err")))],
    *[c(f"calibrate --holdout {v!r}", ["calibrate", E, "--prompts", P, "--max-new-tokens", "3", "--holdout", v], e)
      for v, e in (("-0.1", "err"), ("0", "ok"), ("1", "err"), ("0.99", "?"), ("nan", "err"), ("inf", "err"), ("-0", "ok"),
                   ("0.5", "ok"))],
    c("calibrate --seed -1 sampled", ["calibrate", E, "--prompts", P, "--max-new-tokens", "3", "--temperature", "1", "--seed", "-1"], "ok"),
    c("calibrate --seed big sampled", ["calibrate", E, "--prompts", P, "--max-new-tokens", "3", "--temperature", "1", "--seed", HUGE], "ok"),
    c("calibrate --holdout-prompts = --prompts", ["calibrate", E, "--prompts", P, "--holdout-prompts", P, "--max-new-tokens", "3"]),
    c("calibrate --report = engines.json", ["calibrate", E, "--prompts", P, "--report", f"{E}/engines.json"]),
]
BENCH = ["bench", E, "--prompts", P, "--peers", "none", "--no-profile", "--governors", "off", "--limit", "1",
         "--max-new-tokens", "2", "--quiet", "--force"]
CASES["bench"] = [
    *[c(f"bench {opt} {v!r}", [*BENCH, "-o", f"{O}/bn{opt}{i}", opt, v], e)
      for opt, vals in (("--max-new-tokens", (("0", "err"), ("-1", "err"), (BIG, "?"), (HUGE, "?"))),
                        ("--limit", (("0", "err"), ("-1", "err"), (BIG, "ok"), (HUGE, "ok"))),
                        ("--lookup-tokens", (("0", "err"), ("-1", "err"), (HUGE, "?"))),
                        ("--warmup-tokens", (("-1", "err"), ("0", "ok"), (HUGE, "?"))),
                        ("--processes", (("0", "err"), ("-1", "err"), (HUGE, "err"))),
                        ("--repeats", (("0", "err"), ("-1", "err"), (HUGE, "err"))),
                        ("--threads", (("0", "?"), ("-1", "err"))),
                        ("--temperature", (("nan", "err"), ("-1", "err"))),
                        ("--seed", (("-2", "err"), (HUGE, "?"))),
                        ("--governors", (("", "err"), (",", "err"), ("off,off", "?"), ("off, fixed:1", "?"), ("fixed:9", "err"))),
                        ("--peers", (("none,hf", "err"), ("bogus", "err"))),
                        ("--variant", (("=/tmp", "err"), ("a=", "err"), (f"a={E}", "?"), ("noeq", "err"))))
      for i, (v, e) in enumerate(vals)],
    c("bench --variant twice same label", [*BENCH, "-o", f"{O}/bnv2", "--variant", f"a={E}", "--variant", f"a={E}"]),
    c("bench -o = engines", [*BENCH, "-o", E]),
    c("bench -o existing file", [*BENCH, "-o", P]),
]
SERVE = ["serve", RE]
CASES["serve"] = [
    *[c(f"serve --port {v!r}", [*SERVE, "--port", v], e, serve=True) for v, e in
      (("-1", "err"), ("65536", "err"), ("0", "ok"), ("1", "ok"), (BIG, "err"), ("", "err"))],
    *[c(f"serve --host {v!r}", [*SERVE, "--port", "0", "--host", v], e, serve=True) for v, e in
      (("localhost", "ok"), ("::1", "ok"), ("127.0.0.1 ", "?"), ("256.0.0.1", "err"), ("nonexistent.invalid", "err"),
       ("127.0.0.1:8000", "err"), ("[::1]", "?"), ("-", "err"), ("http://127.0.0.1", "err"))],
    *[c(f"serve --write-timeout {v!r}", [*SERVE, "--port", "0", "--write-timeout", v], e, serve=True) for v, e in
      (("0", "err"), ("-1", "err"), ("nan", "err"), ("inf", "err"), ("3601", "err"), ("1e-300", "?"), ("3600", "ok"))],
    c("serve --prefix-snapshots big", [*SERVE, "--port", "0", "--prefix-snapshots", BIG], "?", serve=True),
    c("serve --max-new-tokens big", [*SERVE, "--port", "0", "--max-new-tokens", BIG], "?", serve=True),
    c("serve --temperature nan", [*SERVE, "--port", "0", "--temperature", "nan"], serve=True),
    c("serve --model-name nl", [*SERVE, "--port", "0", "--model-name", "m\n"], "?", serve=True),
    c("serve --api-key nl", [*SERVE, "--port", "0", "--api-key", "k\n"], "?", serve=True),
    c("serve --governor bad", [*SERVE, "--port", "0", "--governor", "fixed:9"], serve=True),
    c("serve tiny (no tokenizer)", ["serve", E, "--port", "0"], serve=True),
]
CASES["chat"] = [
    c("chat --max-new-tokens big", ["chat", RE, "--max-new-tokens", BIG, "--governor", "fixed:1"], "?", stdin="Hi\n"),
    c("chat --max-new-tokens 1", ["chat", RE, "--max-new-tokens", "1"], "ok", stdin="Hi\n"),
    c("chat --system ''", ["chat", RE, "--system", "", "--max-new-tokens", "2"], "ok", stdin="Hi\n"),
    c("chat --system huge", ["chat", RE, "--system", "word " * 400, "--max-new-tokens", "2"], "err", stdin="Hi\n"),
    c("chat --temperature 1 --top-k big", ["chat", RE, "--temperature", "1", "--top-k", BIG, "--max-new-tokens", "2", "--seed", "1"], "ok", stdin="Hi\n"),
    c("chat empty stdin", ["chat", RE, "--max-new-tokens", "2"], "ok", stdin=""),
    c("chat unicode", ["chat", RE, "--max-new-tokens", "2"], "ok", stdin="héllo 日本 \U0001F600\n"),
    c("chat --chat-template-kwargs", ["chat", RE, "--max-new-tokens", "2", "--chat-template-kwargs", '{"add_generation_prompt": false}'], "?", stdin="Hi\n"),
    c("run real --stop ''", ["run", RE, "--prompt", "Hi", "--max-new-tokens", "2", "--stop", ""], "err"),
    c("run real --stop newline", ["run", RE, "--prompt", "Hi", "--max-new-tokens", "4", "--stop", "\n"], "ok"),
    c("run real --prompt ''", ["run", RE, "--prompt", "", "--max-new-tokens", "2"], "?"),
    c("run real --prompt ' '", ["run", RE, "--prompt", " ", "--max-new-tokens", "2"], "?"),
    c("run real --chat --prompt ''", ["run", RE, "--chat", "--prompt", "", "--max-new-tokens", "2"], "?"),
    c("run real --max-new-tokens big", ["run", RE, "--prompt", "Hi", "--max-new-tokens", BIG, "--governor", "fixed:1", "--stop", "."], "?"),
    c("run real --chat-template-kwargs add_generation_prompt", ["run", RE, "--chat", "--prompt", "Hi", "--max-new-tokens", "2", "--chat-template-kwargs", '{"messages": 1}'], "?"),
    c("run real --logprobs 20", ["run", RE, "--prompt", "Hi", "--max-new-tokens", "2", "--logprobs", "20", "--stats", f"{O}/rlp.json"], "ok"),
]

def prep():
    Path(O).mkdir(exist_ok=True)
    w = lambda n, t: Path(O, n).write_bytes(t if isinstance(t, bytes) else t.encode())
    w("empty.jsonl", ""); w("blank.jsonl", "\n  \n\n"); w("binary.jsonl", b"\x00\xff\xfe\x80garbage\n")
    w("bom.jsonl", b"\xef\xbb\xbf" + b'{"prompt_ids": [5, 6, 7]}\n')
    w("bigid.jsonl", '{"prompt_ids": [5, %d]}\n' % 2**63); w("floatid.jsonl", '{"prompt_ids": [5, 6.0]}\n')
    w("negid.jsonl", '{"prompt_ids": [5, -1]}\n'); w("emptyid.jsonl", '{"prompt_ids": []}\n')
    w("boolid.jsonl", '{"prompt_ids": [true, 5]}\n')
    w("long60.jsonl", json.dumps({"prompt_ids": list(range(3, 63))}) + "\n")
    w("long64.jsonl", json.dumps({"prompt_ids": list(range(3, 67))}) + "\n")
    w("garbage.npz", b"not an npz")
    w("answers.jsonl", "".join(json.dumps({"prompt_ids": list(range(3, 20)), "answer_ids": list(range(20, 40))}) + "\n"
                               for _ in range(3)))

def run_case(case):
    env = dict(os.environ, SPECRT_THP="0", PYTHONUNBUFFERED="1")
    cmd = ["nice", "-n", "10", SPECRT, *case["args"]]
    t0 = time.time()
    if case["serve"]:
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                             text=True, start_new_session=True)
        err, line = [], ""
        deadline = t0 + case["timeout"]
        os.set_blocking(p.stderr.fileno(), True)
        import selectors
        sel = selectors.DefaultSelector(); sel.register(p.stderr, selectors.EVENT_READ)
        served = False
        while time.time() < deadline:
            if sel.select(timeout=1):
                line = p.stderr.readline()
                if not line:
                    break
                err.append(line)
                if line.startswith("serving "):
                    served = True
                    break
            elif p.poll() is not None:
                break
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
            try:
                out, rest = p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL); out, rest = p.communicate()
            err.append(rest)
        else:
            out, rest = p.communicate(); err.append(rest)
        stderr, rc, hung = "".join(err), p.returncode, not served and time.time() >= deadline
        rc = "served" if served else rc
    else:
        try:
            r = subprocess.run(cmd, input=case["stdin"] if case["stdin"] is not None else "", capture_output=True,
                               text=True, env=env, timeout=case["timeout"], errors="replace")
            stderr, out, rc, hung = r.stderr, r.stdout, r.returncode, False
        except subprocess.TimeoutExpired as e:
            stderr, out, rc, hung = (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or ""), "", None, True
    lines = [l for l in stderr.splitlines() if l.strip()]
    first = next((l for l in lines if l.startswith(("error", "Error", "Traceback", "Aborted"))), lines[0] if lines else "")
    tb = "Traceback" in stderr
    return dict(name=case["name"], args=case["args"], expect=case["expect"], rc=rc, traceback=tb, hung=hung,
                first=first, last=lines[-1] if lines else "", stdout=(out or "")[:300], secs=round(time.time() - t0, 1),
                stderr=stderr[-3000:])

def verdict(r):
    ok = r["rc"] in (0, "served")
    if r["traceback"] or r["hung"]:
        return "BAD"
    if r["rc"] not in (0, 1, "served"):
        return "BAD"
    if r["expect"] == "err" and ok:
        return "BAD?"
    if r["expect"] == "ok" and not ok:
        return "BAD?"
    return "ok" if r["expect"] != "?" else "read"


# second pass: the rest of the options, and the mended cases again
CASES["extra"] = [
    c("inspect --json", ["inspect", f"{REF}/verifier", "--draft", f"{REF}/draft", "--json"], "ok"),
    c("inspect TARGET=file", ["inspect", f"{REF}/verifier/config.json"]),
    c("inspect --allow-pickle (none there)", ["inspect", f"{REF}/verifier", "--allow-pickle"], "ok"),
    c("inspect --allow-draft-pickle w/o draft", ["inspect", f"{REF}/verifier", "--allow-draft-pickle"]),
    c("canary tiny", ["canary", f"{O}/b5"], "ok"),
    c("profile --repeats 1", ["profile", f"{O}/b5", "--repeats", "1"], "ok"),
    c("profile --repeats 10001", ["profile", f"{O}/b5", "--repeats", "10001"]),
    c("run --no-prefix-reuse --prompt", ["run", E, "--prompts", P, "--no-prefix-reuse", "--max-new-tokens", "2", "--quiet"], "ok"),
    c("bench --peer-threading defaults --peers none", [*BENCH, "-o", f"{O}/bx1", "--peer-threading", "defaults"], "?"),
    c("bench --schedule sequential --processes 2", [*BENCH, "-o", f"{O}/bx2", "--schedule", "sequential", "--processes", "2"]),
    c("bench --governor-costs profiled --no-profile", [*BENCH, "-o", f"{O}/bx3", "--governor-costs", "profiled"]),
    c("bench --processes 1000 (4 prompts)", ["bench", E, "--prompts", P, "--peers", "none", "--no-profile", "--governors",
                                             "off", "--max-new-tokens", "2", "--quiet", "--force", "-o", f"{O}/bx4",
                                             "--processes", "1000"], "ok"),
    c("bench --repeats 1001", [*BENCH, "-o", f"{O}/bx5", "--repeats", "1001"]),
    c("bench --repeats HUGE", [*BENCH, "-o", f"{O}/bx6", "--repeats", HUGE]),
    c("bench --lookup-tokens HUGE", [*BENCH, "-o", f"{O}/bx7", "--lookup-tokens", HUGE]),
    c("bench --target w/o peers", [*BENCH, "-o", f"{O}/bx8", "--target", f"{REF}/verifier"], "?"),
    c("run --governor auto:ngram=3 stats", ["run", E, "--prompts", P, "--max-new-tokens", "2", "--quiet", "--governor",
                                            "auto:ngram=3", "--stats", f"{O}/an3.json"], "ok"),
    c("run --governor auto:ngram=0", ["run", E, "--prompts", P, "--max-new-tokens", "2", "--governor", "auto:ngram=0"]),
    c("run --stop surrogate", [*RUN1, "--stop", "\udce9"]),
    c("compare small context", ["compare", f"{O}/mc4"]),
    c("compare ctx 8 default", ["compare", f"{O}/mc5"], "ok"),
    c("serve --host ::1", ["serve", RE, "--port", "0", "--host", "::1"], "ok", serve=True),
    c("serve --api-key non-ascii", ["serve", RE, "--port", "0", "--api-key", "kéy"], serve=True),
    c("chat --reproducible greedy", ["chat", RE, "--reproducible", "--max-new-tokens", "2"], "ok", stdin="Hi\n"),
]


if __name__ == "__main__":
    prep()
    only = os.environ.get("ONLY")
    for g in sys.argv[1:]:
        out = Path(f"/tmp/w70d-sweep/{g}.jsonl")
        with out.open("a") as f:
            for case in CASES[g]:
                if only and only not in case["name"]:
                    continue
                r = run_case(case)
                r["verdict"] = verdict(r)
                f.write(json.dumps(r) + "\n"); f.flush()
                print(f"{r['verdict']:5s} rc={r['rc']!s:6s} {r['secs']:5.1f}s {r['name']!r}: {r['first'][:160]}", flush=True)
