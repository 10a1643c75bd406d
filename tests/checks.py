"""The CLI tests' tally: check(name, ok, detail) prints one line per check, finish() prints the closing
'N passed, N failed' line and exits non-zero on any failure."""
import sys


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, name, ok, detail=""):
        print("%-4s %s%s" % ("ok" if ok else "FAIL", name, ("  " + detail) if detail and not ok else ""))
        if ok:
            self.passed += 1
        else:
            self.failed += 1

    def finish(self):
        print("%d passed, %d failed" % (self.passed, self.failed))
        sys.exit(1 if self.failed else 0)


def run_ok(args, env=None):
    """Runs a command; a non-zero exit ends the test with its output."""
    import subprocess
    r = subprocess.run(args, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("FAIL: %s exited %d\n%s%s" % (" ".join(args), r.returncode,
                                                         r.stdout[-2000:], r.stderr[-3000:]))
    return r.stdout
