// The page's script. Reads ?server=URL&count=N, then over gRPC-Web (the
// binary format, application/grpc-web+proto) asks that snowkeep server for
// its id layout (InfoService.GetInfo) and N ids (IdService.NextIds), and
// renders each id exactly, as the decimal string of its bigint, with the
// machine id, sequence and time it decodes to. A failed call shows #error
// with the gRPC status code; a browser that blocks the call (the server does
// not allow this page's origin with --cors-allow-origins) fails it too.
import { ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcWebTransport } from "@connectrpc/connect-web";
import { IdService } from "./gen/snowkeep/v1/id_pb";
import { InfoService, type Layout } from "./gen/snowkeep/v1/info_pb";

/** gRPC's names of the status codes, by number. */
const CODES = [
  "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
  "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
  "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
  "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
] as const;

/** What an id is made of under `layout`. */
function decode(id: bigint, layout: Layout) {
  const sequenceBits = BigInt(layout.sequenceBits);
  const machineBits = BigInt(layout.machineBits);
  const ticks = id >> (sequenceBits + machineBits);
  return {
    machineId: (id >> sequenceBits) & ((1n << machineBits) - 1n),
    sequence: id & ((1n << sequenceBits) - 1n),
    // A tick of 0 ms comes from a server older than time units: 1 ms.
    unixMs: layout.epochUnixMs + ticks * BigInt(layout.timeUnitMs || 1),
  };
}

function element<T extends HTMLElement>(selector: string): T {
  const found = document.querySelector<T>(selector);
  if (!found) throw new Error(`no ${selector} in the page`);
  return found;
}

function cell(row: HTMLTableRowElement, text: string) {
  row.insertCell().textContent = text;
}

async function main() {
  const params = new URLSearchParams(location.search);
  const server = params.get("server") ?? "http://127.0.0.1:50051";
  const count = Number(params.get("count") ?? "5");
  element("#server").textContent = server;

  const transport = createGrpcWebTransport({ baseUrl: server, useBinaryFormat: true });
  const info = createClient(InfoService, transport);
  const ids = createClient(IdService, transport);
  const status = element("#status");
  let call = "InfoService.GetInfo";
  try {
    const about = await info.getInfo({}, { timeoutMs: 30_000 });
    if (!about.layout) throw new Error("GetInfo returned no layout");
    call = "IdService.NextIds";
    const response = await ids.nextIds({ count }, { timeoutMs: 30_000 });
    const body = element<HTMLTableElement>("#ids").tBodies[0]!;
    for (const id of response.ids) {
      const { machineId, sequence, unixMs } = decode(id, about.layout);
      const row = body.insertRow();
      row.className = "id";
      row.dataset.id = id.toString();
      row.dataset.machineId = machineId.toString();
      cell(row, id.toString());
      cell(row, machineId.toString());
      cell(row, sequence.toString());
      cell(row, new Date(Number(unixMs)).toISOString());
    }
    element("#ids").hidden = false;
    status.textContent = `${response.ids.length} ids from ${server} (snowkeep ${about.version}, namespace "${about.namespace}")`;
    status.dataset.state = "done";
  } catch (e) {
    const error = ConnectError.from(e);
    const code = CODES[error.code] ?? String(error.code);
    const shown = element("#error");
    shown.dataset.code = code;
    shown.textContent = `${call} failed: ${code} (${error.code}): ${error.rawMessage}`;
    shown.hidden = false;
    status.textContent = `The call to ${server} failed.`;
    status.dataset.state = "failed";
  }
}

void main();
