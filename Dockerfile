# syntax=docker/dockerfile:1
# Tidings: one image build, four service targets. Each image also carries the operator CLI,
# `tidings` (kubectl exec deploy/api -- tidings doctor: the api's token is in its environment).
#
#   docker build --target api        -t tidings-api .
#   docker build --target dispatcher -t tidings-dispatcher .
#   docker build --target pusher     -t tidings-pusher .
#   docker build --target detector   -t tidings-detector .
#
# The builder compiles the dependencies in their own layer (only Cargo.toml/Cargo.lock and stub
# sources), so a source change rebuilds Tidings' crates only. The runtime is distroless (glibc,
# CA certificates, no shell), running as uid 65532.

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-slim-bookworm AS builder
WORKDIR /src
ENV CARGO_TERM_COLOR=never CARGO_INCREMENTAL=0
# aws-lc-rs builds its C core with cmake and a C compiler.
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake=3.25.* clang=1:14.* \
 && rm -rf /var/lib/apt/lists/*

# 1. Dependencies only: manifests and empty crate roots.
COPY Cargo.toml Cargo.lock ./
COPY shared/domain/Cargo.toml shared/domain/
COPY shared/runtime/Cargo.toml shared/runtime/
COPY shared/bus/Cargo.toml shared/bus/
COPY shared/webpush/Cargo.toml shared/webpush/
COPY shared/endpoint-guard/Cargo.toml shared/endpoint-guard/
COPY shared/signatures/Cargo.toml shared/signatures/
COPY shared/sealing/Cargo.toml shared/sealing/
COPY shared/email/Cargo.toml shared/email/
COPY shared/source/Cargo.toml shared/source/
COPY shared/store/Cargo.toml shared/store/build.rs shared/store/
COPY shared/testkit/Cargo.toml shared/testkit/
COPY shared/api-types/Cargo.toml shared/api-types/
COPY api/Cargo.toml api/
COPY dispatcher/Cargo.toml dispatcher/
COPY pusher/Cargo.toml pusher/
COPY detector/Cargo.toml detector/
COPY cli/Cargo.toml cli/
COPY tests/Cargo.toml tests/
COPY tests/benches/Cargo.toml tests/benches/
RUN for c in shared/domain shared/runtime shared/bus shared/webpush shared/endpoint-guard shared/signatures shared/sealing shared/email shared/source shared/store shared/testkit shared/api-types \
             api dispatcher pusher detector cli tests; do \
      mkdir -p "$c/src/bin" && echo "fn main() {}" > "$c/src/main.rs" && touch "$c/src/lib.rs"; \
    done \
 && mkdir -p tests/benches/src/bin && touch tests/benches/src/lib.rs \
 && echo "fn main() {}" > shared/testkit/src/bin/tidings_fakes.rs \
 && echo "fn main() {}" > tests/src/bin/tidings_demo.rs \
 && for b in bench_dispatcher bench_pusher bench_detector bench_api bench_pipeline bench_dedup bench_hints chaos; do \
      echo "fn main() {}" > "tests/benches/src/bin/$b.rs"; \
    done \
 && mkdir -p migrations \
 && cargo build --release --locked -p tidings-api -p tidings-dispatcher -p tidings-pusher -p tidings-detector \
      -p tidings-cli \
 && rm -rf shared/*/src api/src dispatcher/src pusher/src detector/src cli/src

# 2. Tidings itself (tests/tests/deploy.rs checks this file without a container engine).
COPY migrations migrations
# The browser client, service worker and demo page, compiled into the api.
COPY web web
COPY shared shared
COPY api api
COPY dispatcher dispatcher
COPY pusher pusher
COPY detector detector
COPY cli cli
RUN touch shared/*/src/lib.rs api/src/main.rs dispatcher/src/main.rs pusher/src/main.rs detector/src/main.rs \
      cli/src/main.rs \
 && cargo build --release --locked \
      -p tidings-api --bin tidings-api \
      -p tidings-dispatcher --bin tidings-dispatcher \
      -p tidings-pusher --bin tidings-pusher \
      -p tidings-detector --bin tidings-detector \
      -p tidings-cli --bin tidings \
 && mkdir /out && cp target/release/tidings-api target/release/tidings-dispatcher \
      target/release/tidings-pusher target/release/tidings-detector target/release/tidings /out/

FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
COPY --from=builder /out/ /usr/local/bin/
USER 65532:65532
ENV RUST_LOG=info

FROM runtime AS api
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/tidings-api", "serve"]

FROM runtime AS dispatcher
EXPOSE 9090
ENTRYPOINT ["/usr/local/bin/tidings-dispatcher"]

FROM runtime AS pusher
EXPOSE 9090
ENTRYPOINT ["/usr/local/bin/tidings-pusher"]

FROM runtime AS detector
EXPOSE 9090
ENTRYPOINT ["/usr/local/bin/tidings-detector"]
