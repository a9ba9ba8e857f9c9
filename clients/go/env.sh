# Sourced by clients/go/{ensure-deps,generate,test} and conformance/drivers/go/*:
# the pinned Go toolchain and plugins under the repository's target/, and
# Go's caches there too (nothing global, nothing from /usr/local/go).
# Expects $root (the repository root) to be set.
go_pin=go1.26.8
protoc_gen_go_pin=v1.36.12      # google.golang.org/protobuf/cmd/protoc-gen-go
protoc_gen_go_grpc_pin=v1.6.2   # google.golang.org/grpc/cmd/protoc-gen-go-grpc
tools="$root/target/tools"
GO="$tools/$go_pin/bin/go"
export GOTOOLCHAIN=local
export GOFLAGS='-modcacherw -buildvcs=false'
export GOMODCACHE="$root/target/go/mod"
export GOCACHE="$root/target/go/build-cache"
export GOPATH="$root/target/go/path"
proxy=${GOPROXY:-https://proxy.golang.org}
export GOPROXY="$proxy"
export PATH="$tools/$go_pin/bin:$tools/bin:$PATH"
