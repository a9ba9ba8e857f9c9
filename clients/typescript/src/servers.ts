/**
 * The endpoints of one client: a grpc-js channel each (opened lazily on the
 * first call), the round-robin choice that skips ejected endpoints, and the
 * ejection bookkeeping of the retry rule.
 */

import { ChannelCredentials, type ChannelOptions, credentials, Metadata } from "@grpc/grpc-js";

import { IdServiceClient } from "./gen/snowkeep/v1/id.js";
import { InfoServiceClient } from "./gen/snowkeep/v1/info.js";
import type { Endpoint, Settings } from "./options.js";

/** One endpoint with its stubs and its ejection state. */
export class Server {
  /** Consecutive retryable failures; 0 after a success. */
  failures = 0;
  /** `performance.now()` until which the endpoint is skipped. */
  ejectedUntil = 0;

  constructor(
    readonly endpoint: Endpoint,
    readonly ids: IdServiceClient,
    readonly info: InfoServiceClient,
  ) {}
}

function channelCredentials(endpoint: Endpoint, settings: Settings): ChannelCredentials {
  if (!endpoint.tls) {
    return credentials.createInsecure();
  }
  const t = settings.tls;
  return credentials.createSsl(t?.ca ?? null, t?.key ?? null, t?.cert ?? null);
}

/** Monotonic milliseconds. */
export function now(): number {
  return performance.now();
}

/** The endpoints of a client, in the order given. */
export class Servers {
  readonly list: readonly Server[];
  private cursor = 0;
  private closedFlag = false;
  private readonly metadata: Metadata;

  constructor(private readonly settings: Settings) {
    const options: ChannelOptions = {
      "grpc.max_receive_message_length": 64 << 20,
      "grpc.enable_retries": 0,
      "grpc.initial_reconnect_backoff_ms": Math.max(20, Math.min(settings.backoffMs, 1000)),
      "grpc.max_reconnect_backoff_ms": Math.max(100, settings.maxBackoffMs),
    };
    this.list = settings.endpoints.map((endpoint) => {
      const ids = new IdServiceClient(endpoint.target, channelCredentials(endpoint, settings), options);
      const info = new InfoServiceClient(endpoint.target, channelCredentials(endpoint, settings), {
        ...options,
        channelOverride: ids.getChannel(),
      });
      return new Server(endpoint, ids, info);
    });
    this.metadata = new Metadata();
    if (settings.apiKey !== null) {
      this.metadata.set("authorization", `Bearer ${settings.apiKey}`);
    }
  }

  /** The metadata of one call: the API key, when set. */
  callMetadata(): Metadata {
    return this.metadata.clone();
  }

  /** True once {@link Servers.close} ran. */
  get closed(): boolean {
    return this.closedFlag;
  }

  /**
   * The server for the next attempt: the next in round-robin order that is
   * not ejected, or, when every one is, the one whose ejection ends first.
   */
  pick(): Server {
    const n = this.list.length;
    const t = now();
    let chosen = -1;
    for (let k = 0; k < n; k++) {
      const i = (this.cursor + k) % n;
      if (this.list[i]!.ejectedUntil <= t) {
        chosen = i;
        break;
      }
    }
    if (chosen < 0) {
      chosen = 0;
      for (let i = 1; i < n; i++) {
        if (this.list[i]!.ejectedUntil < this.list[chosen]!.ejectedUntil) {
          chosen = i;
        }
      }
    }
    this.cursor = (chosen + 1) % n;
    return this.list[chosen]!;
  }

  /** Ejects `server` after a retryable failure: backoff doubling per failure, up to max backoff. */
  eject(server: Server): void {
    server.failures += 1;
    const span = Math.min(this.settings.backoffMs * 2 ** Math.min(server.failures - 1, 30), this.settings.maxBackoffMs);
    server.ejectedUntil = now() + span;
  }

  /** Clears `server`'s ejection after a success. */
  clear(server: Server): void {
    server.failures = 0;
    server.ejectedUntil = 0;
  }

  /** Closes every channel; calls in flight end with CANCELLED. */
  close(): void {
    this.closedFlag = true;
    for (const s of this.list) {
      s.ids.close();
    }
  }
}
