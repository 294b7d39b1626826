#!/usr/bin/env bash
# Re-creates book/_static/mathjax/ (the MathJax the book serves itself, see _config.yml
# `mathjax_path`) from the pinned npm tarball, checked against the registry's sha512. Only needed to
# change the MathJax version: the vendored files are committed, so `make book` works offline.
#
#   bash .ci/vendor_mathjax.sh
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

VERSION=3.2.2
# `npm view mathjax@3.2.2 dist.integrity`
SHA512_BASE64="Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw=="
URL="https://registry.npmjs.org/mathjax/-/mathjax-$VERSION.tgz"
DEST=book/_static/mathjax

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
curl -fsSL "$URL" -o "$work/mathjax.tgz"
got="$(openssl dgst -sha512 -binary "$work/mathjax.tgz" | base64 -w0)"
if [[ "$got" != "$SHA512_BASE64" ]]; then
  echo "sha512 of $URL is $got, expected $SHA512_BASE64" >&2
  exit 1
fi
tar -xzf "$work/mathjax.tgz" -C "$work"

rm -rf "$DEST"
mkdir -p "$DEST/output/chtml/fonts"
# tex-chtml-full.js: TeX input with every extension compiled in (tex-chtml.js would autoload
# extensions such as \boldsymbol or \cancel from the network). Its fonts are looked up relative to
# the script: [mathjax]/output/chtml/fonts/woff-v2.
cp "$work/package/es5/tex-chtml-full.js" "$DEST/"
cp -r "$work/package/es5/output/chtml/fonts/woff-v2" "$DEST/output/chtml/fonts/"
cp "$work/package/LICENSE" "$DEST/LICENSE"
echo "MathJax $VERSION into $DEST ($(du -sh "$DEST" | cut -f1))"
