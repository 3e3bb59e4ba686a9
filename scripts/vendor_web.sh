#!/usr/bin/env bash
# The chat page's JavaScript libraries, pinned: fetched from npm (`npm pack`) and copied,
# with their licences, into edgespec/serve/web/vendor/ under names that carry their versions
# (the server caches vendor files for a year). The copies are committed: the page needs
# neither npm nor a network at run time. To update, change a version here, run this,
# change the import in edgespec/serve/web/js/ that names the file, and commit.
set -euo pipefail
MARKED=18.3.0       # markdown (MIT)
DOMPURIFY=3.5.0     # HTML sanitizer (Apache-2.0 or MPL-2.0)
HIGHLIGHT=11.12.0   # code highlighting, the common languages (BSD-3-Clause)

root="$(cd "$(dirname "$0")/.." && pwd)"
out="$root/edgespec/serve/web/vendor"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
npm pack --silent "marked@$MARKED" "dompurify@$DOMPURIFY" "@highlightjs/cdn-assets@$HIGHLIGHT" >/dev/null
for tgz in *.tgz; do mkdir "${tgz%.tgz}" && tar xzf "$tgz" -C "${tgz%.tgz}"; done

rm -rf "$out" && mkdir -p "$out"
# (without the source-map comment: the maps are not shipped)
copy() { grep -v '^//# sourceMappingURL=' "$1" > "$out/$2"; }
copy "marked-$MARKED/package/lib/marked.esm.js" "marked-$MARKED.esm.js"
copy "dompurify-$DOMPURIFY/package/dist/purify.es.mjs" "purify-$DOMPURIFY.es.mjs"
copy "highlightjs-cdn-assets-$HIGHLIGHT/package/es/highlight.min.js" "highlight-$HIGHLIGHT.min.js"
cp "marked-$MARKED/package/LICENSE" "$out/marked-$MARKED.LICENSE.txt"
cp "dompurify-$DOMPURIFY/package/LICENSE" "$out/purify-$DOMPURIFY.LICENSE.txt"
cp "highlightjs-cdn-assets-$HIGHLIGHT/package/LICENSE" "$out/highlight-$HIGHLIGHT.LICENSE.txt"
ls -l "$out"
