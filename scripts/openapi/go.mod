module example.invalid/snowkeep/scripts/openapi

go 1.26

require (
	go.yaml.in/yaml/v3 v3.0.4
	google.golang.org/genproto/googleapis/api v0.0.0-20260817212433-ac3dfec99bb1
	google.golang.org/protobuf v1.36.12
)
