// Command openapi turns the OpenAPI 3 document that gnostic's
// protoc-gen-openapi writes (YAML) into the JSON the server serves at
// GET /openapi.json, and describes the server-streaming routes as they are
// answered: newline-delimited JSON, one {"result": …} line per streamed
// message and a last {"error": …} line when the stream ends with an error
// (the google.api.http mapping of a server stream, as grpc-gateway writes it).
//
// Usage: openapi DESCRIPTOR_SET < openapi.yaml > openapi.json
// DESCRIPTOR_SET is the protoc --descriptor_set_out of the same protos
// (with --include_imports), read for which RPCs stream.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"
	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "openapi:", err)
		os.Exit(1)
	}
}

func run() error {
	if len(os.Args) != 2 {
		return fmt.Errorf("usage: openapi DESCRIPTOR_SET < openapi.yaml > openapi.json")
	}
	streams, err := streamingOperations(os.Args[1])
	if err != nil {
		return err
	}
	text, err := io.ReadAll(os.Stdin)
	if err != nil {
		return err
	}
	var doc map[string]any
	if err := yaml.Unmarshal(text, &doc); err != nil {
		return err
	}
	if err := describeStreams(doc, streams); err != nil {
		return err
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(append(out, '\n'))
	return err
}

// streamingOperations returns the operationId (Service_Method, gnostic's
// naming) of every server-streaming RPC that has a google.api.http rule.
func streamingOperations(path string) (map[string]bool, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(raw, &set); err != nil {
		return nil, err
	}
	ops := map[string]bool{}
	for _, f := range set.GetFile() {
		for _, s := range f.GetService() {
			for _, m := range s.GetMethod() {
				if !m.GetServerStreaming() || !proto.HasExtension(m.GetOptions(), annotations.E_Http) {
					continue
				}
				ops[s.GetName()+"_"+m.GetName()] = true
			}
		}
	}
	return ops, nil
}

// describeStreams rewrites the 200 answer of each streaming operation as
// application/x-ndjson lines.
func describeStreams(doc map[string]any, streams map[string]bool) error {
	paths, _ := doc["paths"].(map[string]any)
	found := 0
	for _, item := range paths {
		for _, op := range item.(map[string]any) {
			op, ok := op.(map[string]any)
			if !ok || !streams[fmt.Sprint(op["operationId"])] {
				continue
			}
			found++
			ok200 := op["responses"].(map[string]any)["200"].(map[string]any)
			content := ok200["content"].(map[string]any)
			schema := content["application/json"].(map[string]any)["schema"]
			delete(content, "application/json")
			content["application/x-ndjson"] = map[string]any{"schema": map[string]any{
				"type":        "object",
				"description": "One line of the stream: a streamed message under result, or, as the last line of a stream that ended with an error, its status under error.",
				"properties": map[string]any{
					"result": schema,
					"error":  map[string]any{"$ref": "#/components/schemas/Status"},
				},
			}}
			ok200["description"] = strings.TrimSpace("OK: newline-delimited JSON, one line per streamed message")
		}
	}
	if found != len(streams) {
		return fmt.Errorf("%d streaming RPCs, %d found in the document", len(streams), found)
	}
	return nil
}
