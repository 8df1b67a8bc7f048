#!/usr/bin/env bash
# The storage emulators the Azure and GCS tests start (tests/support/azurite.py, fake_gcs.py), installed
# into the project's .cache from the registries, never globally:
#   Azurite (npm `azurite`)                       -> .cache/npm/node_modules/.bin/azurite-blob
#   fake-gcs-server (Go module, `go install`)     -> .cache/go/bin/fake-gcs-server
# Each is skipped when the pinned version is already there. The npm and Go download/build caches stay
# at their per-user defaults (~/.npm, ~/go/pkg/mod, ~/.cache/go-build), so a fresh clone (CI) installs
# again in seconds on a machine that built them once (the first Go build takes 3-7 minutes on 2 cores).
# Needs node/npm and Go >= 1.26; without them it warns and the emulator tests skip (fail under CI).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
AZURITE_VERSION="${AZURITE_VERSION:-3.37.0}"
FAKE_GCS_VERSION="${FAKE_GCS_VERSION:-v1.56.1}"
NPM_PREFIX="$PWD/.cache/npm"
GO_BIN="$PWD/.cache/go/bin"
status=0

installed_azurite() {
    node -p "require('$NPM_PREFIX/node_modules/azurite/package.json').version" 2>/dev/null || true
}

if ! command -v npm >/dev/null 2>&1; then
    echo "warning: npm not found: Azurite not installed, the Azure tests are skipped (apt-get install nodejs npm)" >&2
    status=1
elif [ "$(installed_azurite)" = "$AZURITE_VERSION" ] && [ -x "$NPM_PREFIX/node_modules/.bin/azurite-blob" ]; then
    echo "azurite $AZURITE_VERSION: already in .cache/npm"
else
    echo "installing azurite $AZURITE_VERSION into .cache/npm (npm)"
    mkdir -p "$NPM_PREFIX"
    # azurite 3.37 declares node >= 22; its blob service runs on node 20 (the engine warning is noise)
    npm install --prefix "$NPM_PREFIX" --no-audit --no-fund --loglevel=error \
        "azurite@$AZURITE_VERSION" || status=$?
fi

installed_fake_gcs() {
    go version -m "$GO_BIN/fake-gcs-server" 2>/dev/null | awk '$1 == "mod" && $2 == "github.com/fsouza/fake-gcs-server" {print $3}'
}

if ! command -v go >/dev/null 2>&1; then
    echo "warning: go not found: fake-gcs-server not installed, the GCS tests are skipped (it needs Go >= 1.26)" >&2
    status=1
elif [ "$(installed_fake_gcs)" = "$FAKE_GCS_VERSION" ]; then
    echo "fake-gcs-server $FAKE_GCS_VERSION: already in .cache/go/bin"
else
    echo "installing fake-gcs-server $FAKE_GCS_VERSION into .cache/go/bin (go install)"
    mkdir -p "$GO_BIN"
    GOBIN="$GO_BIN" GOFLAGS="${GOFLAGS:-} -modcacherw" go install \
        "github.com/fsouza/fake-gcs-server@$FAKE_GCS_VERSION" || status=$?
fi

exit "$status"
