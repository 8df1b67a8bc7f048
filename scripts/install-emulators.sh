#!/usr/bin/env bash
# The storage servers the Azure, GCS and MinIO tests start (tests/support/azurite.py, fake_gcs.py,
# minio.py) and the cluster's S3 server, installed into the project's .cache from the registries,
# never globally:
#   Azurite (npm `azurite`)                       -> .cache/npm/node_modules/.bin/azurite-blob
#   fake-gcs-server (Go module, `go install`)     -> .cache/go/bin/fake-gcs-server
#   MinIO (Go module, `go install`)               -> .cache/go/bin/minio
# Each is skipped when the pinned version is already there. The npm and Go download/build caches stay
# at their per-user defaults (~/.npm, ~/go/pkg/mod, ~/.cache/go-build), so a fresh clone (CI) installs
# again in seconds on a machine that built them once (the first Go builds take minutes on 2 cores:
# fake-gcs-server 3-7, MinIO longer).
# Needs node/npm and Go >= 1.26. Exits non-zero naming what is missing and why; `make emulators`
# then warns (the tests that need it skip) or, under CI=true, fails the run.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
AZURITE_VERSION="${AZURITE_VERSION:-3.37.0}"
FAKE_GCS_VERSION="${FAKE_GCS_VERSION:-v1.56.1}"
# MinIO tags its releases RELEASE.<date>, not semver: the Go module version is this pseudo-version.
MINIO_VERSION="${MINIO_VERSION:-v0.0.0-20260212201848-7aac2a2c5b7c}"
NPM_PREFIX="$PWD/.cache/npm"
GO_BIN="$PWD/.cache/go/bin"
missing=()

installed_azurite() {
    node -p "require('$NPM_PREFIX/node_modules/azurite/package.json').version" 2>/dev/null || true
}

if ! command -v npm >/dev/null 2>&1; then
    missing+=("azurite (npm not found: apt-get install nodejs npm)")
elif [ "$(installed_azurite)" = "$AZURITE_VERSION" ] && [ -x "$NPM_PREFIX/node_modules/.bin/azurite-blob" ]; then
    echo "azurite $AZURITE_VERSION: already in .cache/npm"
else
    echo "installing azurite $AZURITE_VERSION into .cache/npm (npm)"
    mkdir -p "$NPM_PREFIX"
    # azurite 3.37 declares node >= 22; its blob service runs on node 20 (the engine warning is noise)
    npm install --prefix "$NPM_PREFIX" --no-audit --no-fund --loglevel=error \
        "azurite@$AZURITE_VERSION" || missing+=("azurite (npm install exited $?)")
fi

# The version `go install` built into .cache/go/bin/$1 from module $2 (empty when absent).
installed_go_tool() {
    go version -m "$GO_BIN/$1" 2>/dev/null | awk -v mod="$2" '$1 == "mod" && $2 == mod {print $3}'
}

# go_tool BINARY MODULE VERSION: `go install MODULE@VERSION` into .cache/go/bin unless it is there.
go_tool() {
    local binary="$1" module="$2" version="$3"
    if ! command -v go >/dev/null 2>&1; then
        missing+=("$binary (go not found: it needs Go >= 1.26 from go.dev; Debian's is too old)")
    elif [ "$(installed_go_tool "$binary" "$module")" = "$version" ]; then
        echo "$binary $version: already in .cache/go/bin"
    else
        echo "installing $binary $version into .cache/go/bin (go install)"
        mkdir -p "$GO_BIN"
        GOBIN="$GO_BIN" GOFLAGS="${GOFLAGS:-} -modcacherw" go install "$module@$version" \
            || missing+=("$binary (go install exited $?)")
    fi
}

go_tool fake-gcs-server github.com/fsouza/fake-gcs-server "$FAKE_GCS_VERSION"
go_tool minio github.com/minio/minio "$MINIO_VERSION"

if [ "${#missing[@]}" -gt 0 ]; then
    printf 'install-emulators: not installed: %s\n' "${missing[@]}" >&2
    exit 1
fi
