import subprocess, sys, pathlib
src = pathlib.Path("bench/serve_stats.py"); orig = src.read_text()
start = orig.index("def across_windows"); body = orig[start:]
muts = [("s[\"sent\"] for s", "s[\"ok\"] for s"), ("errors[kind] = errors.get(kind, 0) + n", "errors[kind] = n"),
 ("errors.get(kind, 0) + n", "errors.get(kind, 1) + n"), ("windows=len(summaries)", "windows=len(summaries) - 1"),
 ("median=round(float(np.median(values)), 4)", "median=round(float(np.mean(values)), 4)"), ("min=min(values)", "min=max(values)"),
 ("max=max(values)", "max=min(values)"), ("if s[key] is not None]", "if s[key]]"), ("if values else None", "if values else {}"),
 ("rate=summaries[0][\"rate\"]", "rate=summaries[-1][\"rate\"]"), ("dict(sorted(errors.items()))", "errors"),
 ("r[\"sent_s\"] <= kill_s < r[\"end_s\"]", "r[\"sent_s\"] < kill_s < r[\"end_s\"]"), ("r[\"sent_s\"] <= kill_s < r[\"end_s\"]", "r[\"sent_s\"] <= kill_s <= r[\"end_s\"]"),
 ("r[\"sent_s\"] > kill_s]", "r[\"sent_s\"] >= kill_s]"), ("r[\"end_s\"] - kill_s <= bound_s", "r[\"end_s\"] - kill_s < bound_s"),
 ("kinds.get(kind, 0) + 1", "kinds.get(kind, 0) + 2"), ("\"ok\" if r[\"ok\"] else r[\"error_kind\"]", "r[\"error_kind\"]"),
 ("r[\"ok\"] or r[\"e2e_s\"] <= bound_s", "r[\"ok\"] and r[\"e2e_s\"] <= bound_s"), ("r[\"ok\"] or r[\"e2e_s\"] <= bound_s", "r[\"e2e_s\"] <= bound_s"),
 ("default=0.0)", "default=1.0)"), ("bound_s: float = 1.0", "bound_s: float = 2.0"), ("held_outcomes=outcomes(held)", "held_outcomes=outcomes(after)"),
 ("sent_after=len(after)", "sent_after=len(held)"), ("round(max((r[\"end_s\"] - kill_s", "round(min((r[\"end_s\"] - kill_s"),
 ("ok=sum(s[\"ok\"]", "ok=max(s[\"ok\"]")]
survived = []
for a, b in muts:
    if a not in body: print("MISSING", a); continue
    src.write_text(orig[:start] + body.replace(a, b, 1))
    r = subprocess.run([sys.argv[1], "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests/bench/test_serve.py", "-k",
                        "windows or killed or kill_needs"], capture_output=True, text=True)
    print("killed" if r.returncode else "SURVIVED", a, "->", b); 
    if not r.returncode: survived.append((a, b))
src.write_text(orig)
print(len(muts), "mutants,", len(survived), "survived")
