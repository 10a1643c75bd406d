"""Test data shared by the CLI test drivers (tests/*_test.py import it from their own directory)."""

WORDS = "the of and to a in that it is was he for on are as with his they at be".split()


def write_pseudo_english(path, n_words=60000):
    """Writes `n_words` words of deterministic pseudo-English (a fixed LCG over WORDS, a newline
    after about one word in 17) to `path`: the same bytes on every run and machine."""
    x = 12345
    with open(path, "w") as f:
        for _ in range(n_words):
            x = (x * 1103515245 + 12345) % 2**31
            f.write(WORDS[x % len(WORDS)] + ("\n" if x % 17 == 0 else " "))
