import * as Context from "effect/Context"

export type Role = "all" | "control-plane" | "data-plane"

/**
 * How executors run where a task's config says nothing (`serve`'s --llm-max-batch-size,
 * --kv-cache-bytes, ...); a task's own fields replace them.
 */
export interface EngineDefaults {
  /** Requests an LLM executor decodes together on a device. */
  readonly llmMaxBatchSize: number
  readonly maxBatchDelayMs: number
  readonly preprocessThreads: number
  readonly kvCacheBytes?: number
  readonly prefixCacheBytes?: number
  readonly prefillChunkTokens?: number
  readonly kvCacheMode?: "shared" | "copies"
  readonly quantizedRows?: "apart" | "per-row"
  readonly q4Activations?: "exported" | "int8"
}

export const defaultEngineSettings: EngineDefaults = { llmMaxBatchSize: 8, maxBatchDelayMs: 2, preprocessThreads: 2 }

/** Everything `cornserve serve` was told on its command line and in its environment. */
export interface ServeOptions {
  readonly role: Role
  readonly host: string
  readonly port: number
  readonly stateDir: string
  readonly devices: string
  /** This node's name among the platform's nodes (and its sidecar's). */
  readonly nodeId: string
  /** CORNSERVE_CLUSTER_TOKEN: the secret nodes join with (required by both multi-node roles). */
  readonly clusterToken: string | undefined
  /**
   * The secret executors' routes and sidecar peers' handshakes check (src/contracts/Credentials.ts):
   * derived from the cluster token on a cluster, random per `serve` on one machine.
   */
  readonly internalSecret: string
  /** control-plane: the port data-plane nodes join on. */
  readonly clusterPort: number
  /** data-plane: the control plane's cluster URL. */
  readonly join: string | undefined
  /** data-plane: where other nodes reach this node's executors and sidecar. */
  readonly advertiseHost: string
  readonly sidecarArenaBytes: number
  /** Executors' settings that tasks leave out (default: defaultEngineSettings). */
  readonly engineDefaults?: EngineDefaults
  /** The admin routes' token: CORNSERVE_ADMIN_TOKEN, or the one `serve` keeps in the state dir; undefined only with --insecure-no-auth. */
  readonly adminToken: string | undefined
  /** The token `/metrics` needs (CORNSERVE_METRICS_TOKEN); the admin token serves too. */
  readonly metricsToken: string | undefined
  /** `/metrics` open to anyone (--public-metrics): its counters then tell who sent what media before. */
  readonly publicMetrics: boolean
  /** API keys the invoke and OpenAI routes need (--api-key, CORNSERVE_API_KEY); none: open. */
  readonly apiKeys: ReadonlyArray<string>
  /** The gateway's and the cluster port's certificate and key (PEM), from --tls-cert and --tls-key: HTTPS when given. */
  readonly tls: { readonly cert: string; readonly key: string } | undefined
  /** data-plane: the CA (PEM, --tls-ca) the control plane's certificate is checked against. */
  readonly tlsCa: string | undefined
  /**
   * Whether the hosts an app's registration allows may resolve to loopback, private and other
   * non-public addresses (--allow-private-outbound): an internal database, a service on this host.
   */
  readonly allowPrivateOutbound: boolean
  /** Host names besides the bound one and IP literals under which admin requests are taken (DNS rebinding). */
  readonly allowedHosts: ReadonlyArray<string>
  readonly maxBodyBytes: number
  /** How long a client may take to send its headers, and its whole request; 408 and closed after. */
  readonly headersTimeoutMs: number
  readonly receiveTimeoutMs: number
  /** How long a request body may send nothing before it is refused (408, connection closed). */
  readonly bodyIdleTimeoutMs: number
  /** How deeply a JSON request body may nest arrays and objects. */
  readonly maxJsonDepth: number
  readonly requestTimeoutMs: number
  /** Calls each task takes at the dispatcher per executor in rotation before refusing the next (503). */
  readonly taskQueue: number
  /** Bytes of encoder outputs kept to forward again for identical media (0: no cache). */
  readonly embeddingCacheBytes: number
  readonly appLoadTimeoutMs: number
  /**
   * Each app's process: its heap and resident memory caps, how long its event loop may stay busy,
   * and the largest answer (or streamed line) it may send.
   */
  readonly appLimits: {
    readonly heapMiB: number
    readonly rssMiB: number
    readonly stallMs: number
    readonly maxResponseBytes: number
  }
  readonly shutdownGraceMs: number
  /** data-plane: how long executors the control plane no longer holds keep running. */
  readonly executorGraceMs: number
  /** control plane: how often the resource manager moves devices to the tasks that need them; off when absent. */
  readonly autoscaleIntervalMs?: number
  readonly unregisterGraceMs: number
  /**
   * Seconds without a call after which a task's executors stop (their devices freed) until its next
   * call, for tasks whose config sets no `idleReleaseS`; 0 or absent: they are kept.
   */
  readonly idleReleaseS?: number
}

export class ServeConfig extends Context.Tag("cornserve/ServeConfig")<ServeConfig, ServeOptions>() {}
