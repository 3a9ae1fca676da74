import { readFileSync } from "node:fs"
import { homedir } from "node:os"
import { join, delimiter as pathDelimiter, resolve as resolvePath } from "node:path"
import * as Args from "@effect/cli/Args"
import * as Command from "@effect/cli/Command"
import * as HelpDoc from "@effect/cli/HelpDoc"
import * as Options from "@effect/cli/Options"
import * as ValidationError from "@effect/cli/ValidationError"
import * as NodeContext from "@effect/platform-node/NodeContext"
import * as Arr from "effect/Array"
import * as Cause from "effect/Cause"
import * as Config from "effect/Config"
import * as Console from "effect/Console"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Option from "effect/Option"
import { withTidyHelp } from "./HelpText.js"
import { initAppFolder } from "./Init.js"
import { runMain } from "../process/StopSignals.js"
import { defaultMaxJsonDepth } from "../control/gateway/JsonBody.js"
import { defaultLevels, defaultSecondsPerLevel } from "../control/task-manager/ProfileRecording.js"
import { dtypes } from "../models/Dtype.js"
import { modelRootsEnvName, modelRootsFromEnvironment } from "../models/ModelRoots.js"
import { packedWeightsDirEnvName } from "../executors/common/PackedWeights.js"
import { adminTokenPath, ensureAdminToken, readAdminToken } from "../config/AdminTokenFile.js"
import { defaultEngineSettings, type EngineDefaults } from "../config/ServeConfig.js"
import { nodeNameProblem } from "../contracts/ClusterRpcs.js"
import { internalSecretOf } from "../contracts/Credentials.js"
import { parseDevices } from "../node/Devices.js"
import { defaultMaxMediaItems, defaultMediaLimits } from "../executors/common/media/MediaLimits.js"
import { deviceList, executorDefaults } from "../executors/common/ExecutorConfig.js"
import type { GatewayTarget } from "./client.js"

type Client = typeof import("./client.js")

/**
 * The client side of the CLI (bundling and checking apps, the gateway's answers) is loaded by the
 * commands that use it: every process the platform starts runs this binary, and none of them
 * needs it (about 9 MiB of each one's memory).
 */
const fromClient =
  <Args extends ReadonlyArray<unknown>, A, E, R>(pick: (client: Client) => (...args: Args) => Effect.Effect<A, E, R>) =>
  (...args: Args): Effect.Effect<A, E, R> =>
    Effect.flatMap(
      Effect.promise(() => import("./client.js")),
      (client) => pick(client)(...args)
    )
const invokeApp = fromClient((client) => client.invokeApp)
const appLogs = fromClient((client) => client.appLogs)
const checkAppFile = fromClient((client) => client.checkAppFile)
const developApp = fromClient((client) => client.developApp)
const describeApp = fromClient((client) => client.describeApp)
const listApps = fromClient((client) => client.listApps)
const listNodes = fromClient((client) => client.listNodes)
const listTasks = fromClient((client) => client.listTasks)
const recordTaskProfile = fromClient((client) => client.recordTaskProfile)
const scaleTask = fromClient((client) => client.scaleTask)
const showTask = fromClient((client) => client.showTask)
const showTaskProfile = fromClient((client) => client.showTaskProfile)
const previewRegistration = fromClient((client) => client.previewRegistration)
const registerApp = fromClient((client) => client.registerApp)
const unregisterApp = fromClient((client) => client.unregisterApp)

const version = "0.1.0"

/** Whether the gateway bound to `host` can be reached only from this machine. */
const gatewayOption = Options.text("gateway").pipe(
  Options.withDescription("The gateway's URL (or CORNSERVE_GATEWAY_URL)."),
  Options.withFallbackConfig(Config.string("CORNSERVE_GATEWAY_URL")),
  Options.withDefault("http://127.0.0.1:8000")
)

const defaultStateDir = process.env.XDG_STATE_HOME
  ? join(process.env.XDG_STATE_HOME, "cornserve")
  : join(homedir(), ".local", "state", "cornserve")

/**
 * Where a client command sends its requests, with the admin token: CORNSERVE_ADMIN_TOKEN, else the
 * one a platform on this machine made in its state dir (CORNSERVE_STATE_DIR, or the default).
 */
const target = (gateway: string): GatewayTarget => ({
  url: gateway,
  token: process.env.CORNSERVE_ADMIN_TOKEN || readAdminToken(process.env.CORNSERVE_STATE_DIR || defaultStateDir)
})

/** The admin token kept in `stateDir` (made on first start), and where, said once at start. */
const madeAdminToken = (stateDir: string) =>
  Effect.gen(function* () {
    const made = yield* Effect.try({
      try: () => ensureAdminToken(stateDir),
      catch: (cause) => new Error(`cannot keep the admin token in ${stateDir}: ${String(cause)}`)
    })
    yield* Console.log(
      `cornserve: admin token ${made.created ? "made in" : "read from"} ${adminTokenPath(stateDir)} (mode 0600; ` +
        "the CLI on this machine reads it there, others send it as Authorization: Bearer)"
    )
    return made.token
  })

const seconds = (name: string, fallback: number, description: string) =>
  Options.float(name).pipe(
    Options.withDescription(description),
    Options.withDefault(fallback),
    Options.filterMap(
      (value) => (value > 0 ? Option.some(value) : Option.none()),
      `--${name} must be a positive number of seconds`
    )
  )

/**
 * `serve`'s defaults for the settings a task's config may give its executors (LLMTask's
 * maxBatchSize, kvCacheBytes, ...; every task's maxBatchDelayMs and preprocessThreads).
 */
const engineDefaultOptions = {
  llmMaxBatchSize: Options.integer("llm-max-batch-size").pipe(
    Options.withDescription("Requests an LLM executor decodes together on a device, where its task does not say."),
    Options.withDefault(defaultEngineSettings.llmMaxBatchSize)
  ),
  maxBatchDelayMs: Options.float("max-batch-delay-ms").pipe(
    Options.withDescription(
      "How long an executor's batch that is not full may wait to fill, where its task does not say."
    ),
    Options.withDefault(defaultEngineSettings.maxBatchDelayMs)
  ),
  preprocessThreads: Options.integer("preprocess-threads").pipe(
    Options.withDescription("Each executor's threads that decode and preprocess media, where its task does not say."),
    Options.withDefault(defaultEngineSettings.preprocessThreads)
  ),
  kvCacheBytes: Options.integer("kv-cache-bytes").pipe(
    Options.withDescription(
      "An LLM executor's KV cache per device in bytes, its running requests' and its prefix cache's together, where its task does not say (default: its batch at the model's context length, plus the prefix cache's)."
    ),
    Options.optional
  ),
  prefixCacheBytes: Options.integer("prefix-cache-bytes").pipe(
    Options.withDescription(
      "Of an LLM executor's KV cache, the bytes kept for prompts' prefixes per device; 0 keeps none (default 512 MiB, or a quarter of --kv-cache-bytes)."
    ),
    Options.optional
  ),
  prefillChunkTokens: Options.integer("prefill-chunk-tokens").pipe(
    Options.withDescription(
      "Prompt tokens an LLM executor prefills in a step while others decode; 0 prefills each prompt whole (default: sized to their decode step)."
    ),
    Options.optional
  ),
  kvCacheMode: Options.choice("kv-cache-mode", ["shared", "copies"]).pipe(
    Options.withDescription(
      "An LLM executor's KV cache in buffers it owns, read in place (shared, the default where the decoder matches), or the decoder as exported (copies)."
    ),
    Options.optional
  ),
  quantizedRows: Options.choice("quantized-rows", ["apart", "per-row"]).pipe(
    Options.withDescription(
      "8-bit LLM exports that quantise activations per tensor: each request apart (exact, the default), or decode steps batched with a scale per row."
    ),
    Options.optional
  ),
  q4Activations: Options.choice("q4-activations", ["exported", "int8"]).pipe(
    Options.withDescription(
      "4-bit LLM exports (MatMulNBits): activations in fp32 as exported (exact, the default), or quantised to 8 bits per row (about 2x the decode speed; answers may part from transformers.js's at a near-tie)."
    ),
    Options.optional
  )
}

/** The engine defaults `serve` was given. */
const engineDefaultsOf = (
  options: {
    readonly [K in keyof typeof engineDefaultOptions]: (typeof engineDefaultOptions)[K] extends Options.Options<infer A>
      ? A
      : never
  }
): EngineDefaults => ({
  llmMaxBatchSize: options.llmMaxBatchSize,
  maxBatchDelayMs: options.maxBatchDelayMs,
  preprocessThreads: options.preprocessThreads,
  ...Option.match(options.kvCacheBytes, { onNone: () => ({}), onSome: (kvCacheBytes) => ({ kvCacheBytes }) }),
  ...Option.match(options.prefixCacheBytes, {
    onNone: () => ({}),
    onSome: (prefixCacheBytes) => ({ prefixCacheBytes })
  }),
  ...Option.match(options.prefillChunkTokens, {
    onNone: () => ({}),
    onSome: (prefillChunkTokens) => ({ prefillChunkTokens })
  }),
  ...Option.match(options.kvCacheMode, { onNone: () => ({}), onSome: (kvCacheMode) => ({ kvCacheMode }) }),
  ...Option.match(options.quantizedRows, { onNone: () => ({}), onSome: (quantizedRows) => ({ quantizedRows }) }),
  ...Option.match(options.q4Activations, { onNone: () => ({}), onSome: (q4Activations) => ({ q4Activations }) })
})

const serveCommand = Command.make(
  "serve",
  {
    role: Options.choice("role", ["all", "control-plane", "data-plane"]).pipe(
      Options.withDescription("What this node runs: the whole platform (all), or one half of a multi-node platform."),
      Options.withDefault("all" as const)
    ),
    host: Options.text("host").pipe(
      Options.withDescription("The address the gateway listens on."),
      Options.withDefault("127.0.0.1")
    ),
    port: Options.integer("port").pipe(
      Options.withDescription("The gateway's port (0 picks a free one)."),
      Options.withDefault(8000)
    ),
    stateDir: Options.directory("state-dir").pipe(
      Options.withDescription(
        "Where registered apps are kept, so they come back after a restart (or CORNSERVE_STATE_DIR)."
      ),
      Options.withFallbackConfig(Config.string("CORNSERVE_STATE_DIR")),
      Options.withDefault(defaultStateDir)
    ),
    devices: Options.text("devices").pipe(
      Options.withDescription(
        'Devices for task executors: "auto" (the default, but none on a control-plane node: one single-thread cpu ' +
          "device per core) or a list such as cpu:0,cpu:1/4,cuda:0 (cpu:N/T gives a CPU device T threads). When no " +
          "device is free, executors of different tasks share CPU devices, each with a share of the threads; a GPU " +
          "is one executor's alone."
      ),
      // Checked with the other flags, so that a wrong list is a usage error before anything starts.
      Options.mapTryCatch(
        (spec) => {
          parseDevices(spec)
          return spec
        },
        (error) => HelpDoc.p((error as Error).message)
      ),
      Options.optional
    ),
    nodeId: Options.text("node-name").pipe(
      Options.withAlias("node-id"),
      Options.withDescription("This node's name among the platform's nodes (its sidecar's too)."),
      Options.withDefault("local")
    ),
    clusterPort: Options.integer("cluster-port").pipe(
      Options.withDescription("control-plane: the port data-plane nodes join on (bound to --host)."),
      Options.withDefault(8001)
    ),
    join: Options.text("join").pipe(
      Options.withDescription("data-plane: the control plane's cluster URL, e.g. http://HOST:8001."),
      Options.optional
    ),
    advertiseHost: Options.text("advertise-host").pipe(
      Options.withDescription(
        "data-plane: the address other nodes and the control plane reach this node's executors and sidecar at (default: --host)."
      ),
      Options.optional
    ),
    sidecarArenaBytes: Options.integer("sidecar-arena-bytes").pipe(
      Options.withDescription("Shared memory for tensors moving between the node's executors."),
      Options.withDefault(256 * 1024 * 1024)
    ),
    examples: Options.boolean("examples").pipe(
      Options.withDescription("Also register the example apps that ship with Cornserve.")
    ),
    ...engineDefaultOptions,
    requestTimeout: seconds(
      "request-timeout",
      300,
      "Seconds a request may take, its stream included, unless its app sets its own `timeoutMs` (504 before an answer begins; an error line ends a stream)."
    ),
    taskQueue: Options.integer("task-queue").pipe(
      Options.withDescription(
        "Calls each task takes at once, per executor, before it refuses the next with 503 and Retry-After (refused before any of the request's work starts)."
      ),
      Options.withDefault(64),
      Options.filterMap(
        (value) => (value > 0 ? Option.some(value) : Option.none()),
        "--task-queue must be a positive number of calls"
      )
    ),
    embeddingCacheBytes: Options.integer("embedding-cache-bytes").pipe(
      Options.withDescription(
        "Bytes of encoder outputs kept for media sent again (data: URLs, by content and encoder task): such an item is forwarded from the cache, its encoder not called. 0: no cache. A single-node platform only."
      ),
      Options.withDefault(64 * 1024 * 1024),
      Options.filterMap(
        (value) => (value >= 0 ? Option.some(value) : Option.none()),
        "--embedding-cache-bytes must be 0 or more"
      )
    ),
    autoscale: Options.boolean("autoscale").pipe(
      Options.withDescription(
        "Move devices between tasks as their load changes: from tasks with slack to the bottleneck (see tasks profile)."
      )
    ),
    autoscaleInterval: seconds("autoscale-interval", 5, "With --autoscale: seconds between two rebalancing rounds."),
    idleRelease: Options.float("idle-release").pipe(
      Options.withDescription(
        "Seconds without a call after which a task's executors stop and free their devices; its next call starts them again and waits (a cold start). For tasks whose config sets no idleReleaseS. 0: they are kept."
      ),
      Options.withDefault(0),
      Options.filterMap(
        (value) => (value >= 0 && value <= 86_400 * 365 ? Option.some(value) : Option.none()),
        "--idle-release must be 0 (keep executors) or a positive number of seconds"
      )
    ),
    executorGrace: seconds(
      "executor-grace",
      30,
      "data-plane: seconds this node keeps executors running once the control plane no longer holds them " +
        "(it is out of reach, or restarted and did not take them back); stopped after."
    ),
    shutdownGrace: seconds(
      "shutdown-grace",
      10,
      "Seconds requests in flight get to finish on SIGINT/SIGTERM or unregister."
    ),
    maxBodyBytes: Options.integer("max-body-bytes").pipe(
      Options.withDescription("The largest request body accepted (413 beyond)."),
      Options.withDefault(32 * 1024 * 1024)
    ),
    maxResponseBytes: Options.integer("max-response-bytes").pipe(
      Options.withDescription(
        "The largest answer an app may send, or line it may stream (its request fails with AppFailed beyond)."
      ),
      Options.withDefault(64 * 1024 * 1024)
    ),
    headersTimeout: seconds(
      "headers-timeout",
      30,
      "Seconds a client may take to send a request's headers (408 after)."
    ),
    receiveTimeout: seconds(
      "receive-timeout",
      300,
      "Seconds a client may take to send a whole request, headers and body (408 after)."
    ),
    bodyIdleTimeout: seconds(
      "body-idle-timeout",
      10,
      "Seconds a request body may send nothing before it is refused (408, connection closed)."
    ),
    maxJsonDepth: Options.integer("max-json-depth").pipe(
      Options.withDescription("How deeply a JSON request body may nest arrays and objects (400 beyond)."),
      Options.withDefault(defaultMaxJsonDepth)
    ),
    allowedHosts: Options.text("allowed-host").pipe(
      Options.withDescription(
        "A host name clients reach the gateway by, for the admin routes' DNS-rebinding check (repeatable; " +
          "IP addresses, localhost and --host are always allowed)."
      ),
      Options.repeated
    ),
    appMemory: Options.integer("app-memory-mib").pipe(
      Options.withDescription(
        "Memory each app's process may use, in MiB (its JavaScript heap gets three quarters); past it the process " +
          "is restarted and its requests fail."
      ),
      Options.withDefault(1024)
    ),
    appStall: seconds(
      "app-stall-timeout",
      10,
      "Seconds an app's process may keep its event loop busy before it is restarted (its requests fail)."
    ),
    offline: Options.boolean("offline").pipe(
      Options.withDescription(
        "Use only models already on this machine; never download from the hub (also HF_HUB_OFFLINE=1)."
      )
    ),
    insecureNoAuth: Options.boolean("insecure-no-auth").pipe(
      Options.withDescription(
        "Run the admin routes without a token (none from CORNSERVE_ADMIN_TOKEN, none made in the state dir): " +
          "anyone who reaches the port may register code. For a throwaway machine only."
      )
    ),
    apiKeys: Options.text("api-key").pipe(
      Options.withDescription(
        "A key the invoke and OpenAI routes need as `Authorization: Bearer KEY` (repeatable; or CORNSERVE_API_KEY, " +
          "which other users of this machine cannot read from the process list)."
      ),
      Options.repeated
    ),
    allowPrivateOutbound: Options.boolean("allow-private-outbound").pipe(
      Options.withDescription(
        "Let the hosts an app's registration allows (--allow-host) resolve to loopback and private addresses " +
          "(an internal database, a service on this machine); without it only public addresses are reached."
      )
    ),
    tlsCert: Options.file("tls-cert", { exists: "yes" }).pipe(
      Options.withDescription(
        "A certificate (PEM) to serve the gateway and the cluster port over HTTPS (with --tls-key)."
      ),
      Options.optional
    ),
    tlsKey: Options.file("tls-key", { exists: "yes" }).pipe(
      Options.withDescription("The private key (PEM) of --tls-cert."),
      Options.optional
    ),
    tlsCa: Options.file("tls-ca", { exists: "yes" }).pipe(
      Options.withDescription(
        "data-plane: the CA certificate (PEM) the control plane's --tls-cert is checked against (a https --join)."
      ),
      Options.optional
    ),
    modelRoots: Options.directory("model-root", { exists: "yes" }).pipe(
      Options.withDescription(
        "A directory whose model directories tasks may name by path (repeatable; also CORNSERVE_MODEL_ROOTS, " +
          "':'-separated). CORNSERVE_MODEL_DIR and the Hugging Face cache always are; any other path is refused."
      ),
      Options.repeated
    ),
    packedWeightsDir: Options.directory("packed-weights-dir").pipe(
      Options.withDescription(
        "Keep LLM decoders' packed weights here (also CORNSERVE_PACKED_WEIGHTS_DIR): a decoder's first load on the " +
          "CPU writes ONNX Runtime's optimized copy of it, its weights packed, and later loads map that copy instead " +
          "of packing the weights again (a 1B fp32 model: about 3x faster to load, 11 GB on disk beside its 6)."
      ),
      Options.optional
    ),
    publicMetrics: Options.boolean("public-metrics").pipe(
      Options.withDescription(
        "Serve /metrics to anyone. Otherwise it needs CORNSERVE_METRICS_TOKEN or the admin token: its counters " +
          "(the encoder cache's hits) tell whether someone sent a given image before."
      )
    )
  },
  (options) =>
    Effect.gen(function* () {
      const usage = (message: string) =>
        Effect.zipRight(
          Console.error(`cornserve serve: ${message}`),
          Effect.sync(() => {
            process.exitCode = 2
          })
        )
      if (Option.isSome(options.join) && options.role !== "data-plane") {
        return yield* usage(`--join is for --role data-plane (this node's role is ${options.role})`)
      }
      if (options.role === "data-plane" && Option.isNone(options.join)) {
        return yield* usage("--role data-plane needs --join http://CONTROL-PLANE-HOST:CLUSTER-PORT")
      }
      // The control plane refuses such a name at join; said here, before anything starts.
      const nameProblem = options.role === "data-plane" ? nodeNameProblem(options.nodeId) : undefined
      if (nameProblem !== undefined) return yield* usage(`--node-name: ${nameProblem}`)
      if (Option.isSome(options.advertiseHost) && options.role !== "data-plane") {
        return yield* usage("--advertise-host is for --role data-plane")
      }
      const clusterToken = process.env.CORNSERVE_CLUSTER_TOKEN || undefined
      if (options.role !== "all" && clusterToken === undefined) {
        return yield* usage(
          `--role ${options.role} needs CORNSERVE_CLUSTER_TOKEN: the shared secret nodes join the control plane with`
        )
      }
      if (Option.isSome(options.tlsCert) !== Option.isSome(options.tlsKey)) {
        return yield* usage("--tls-cert and --tls-key go together")
      }
      if (Option.isSome(options.tlsCert) && options.role === "data-plane") {
        return yield* usage("--tls-cert is for the gateway and the cluster port; a data-plane node takes --tls-ca")
      }
      if (Option.isSome(options.tlsCa) && options.role !== "data-plane") {
        return yield* usage("--tls-ca is for --role data-plane")
      }
      const pem = (path: Option.Option<string>) =>
        Option.match(path, {
          onNone: () => Effect.succeed(undefined),
          onSome: (file) =>
            Effect.try({
              try: () => readFileSync(file, "utf8"),
              catch: (cause) => new Error(`cannot read ${file}: ${String(cause)}`)
            })
        })
      const tlsCert = yield* pem(options.tlsCert)
      const tlsKey = yield* pem(options.tlsKey)
      const tlsCa = yield* pem(options.tlsCa)
      // A data-plane node serves no admin route: only the gateway takes code to run.
      const adminToken =
        options.role === "data-plane"
          ? undefined
          : process.env.CORNSERVE_ADMIN_TOKEN ||
            (options.insecureNoAuth ? undefined : yield* madeAdminToken(options.stateDir))
      if (options.role !== "data-plane" && adminToken === undefined) {
        yield* Console.error(
          "cornserve: --insecure-no-auth: the admin routes take no token; anyone who reaches the gateway may register and run code"
        )
      }
      // In the environment, so that the executors this process starts refuse to download too.
      if (options.offline) process.env.HF_HUB_OFFLINE = "1"
      // In the environment, so that the node agent and the executors this process starts allow the same roots.
      if (options.modelRoots.length > 0) {
        process.env[modelRootsEnvName] = [
          ...modelRootsFromEnvironment(),
          ...options.modelRoots.map((root) => resolvePath(root))
        ].join(pathDelimiter)
      }
      // In the environment, so that the LLM executors this process starts keep their packed weights there.
      if (Option.isSome(options.packedWeightsDir))
        process.env[packedWeightsDirEnvName] = resolvePath(options.packedWeightsDir.value)
      // Loaded on demand: the client commands start faster without the whole control plane.
      const { serve } = yield* Effect.promise(() => import("./serve.js"))
      return yield* serve({
        role: options.role,
        host: options.host,
        port: options.port,
        stateDir: options.stateDir,
        devices: Option.getOrElse(options.devices, () => (options.role === "control-plane" ? "" : "auto")),
        nodeId: options.nodeId,
        clusterToken,
        internalSecret: internalSecretOf(clusterToken),
        clusterPort: options.clusterPort,
        join: Option.getOrUndefined(options.join),
        advertiseHost: Option.getOrElse(options.advertiseHost, () => options.host),
        sidecarArenaBytes: options.sidecarArenaBytes,
        engineDefaults: engineDefaultsOf(options),
        examples: options.examples,
        adminToken,
        metricsToken: process.env.CORNSERVE_METRICS_TOKEN || undefined,
        tls: tlsCert === undefined || tlsKey === undefined ? undefined : { cert: tlsCert, key: tlsKey },
        tlsCa,
        publicMetrics: options.publicMetrics,
        allowPrivateOutbound: options.allowPrivateOutbound,
        apiKeys: [...options.apiKeys, ...(process.env.CORNSERVE_API_KEY ? [process.env.CORNSERVE_API_KEY] : [])],
        allowedHosts: options.allowedHosts,
        maxBodyBytes: options.maxBodyBytes,
        headersTimeoutMs: Math.round(options.headersTimeout * 1000),
        receiveTimeoutMs: Math.round(options.receiveTimeout * 1000),
        bodyIdleTimeoutMs: Math.round(options.bodyIdleTimeout * 1000),
        maxJsonDepth: options.maxJsonDepth,
        requestTimeoutMs: Math.round(options.requestTimeout * 1000),
        taskQueue: options.taskQueue,
        embeddingCacheBytes: options.embeddingCacheBytes,
        appLoadTimeoutMs: 30_000,
        appLimits: {
          heapMiB: Math.max(16, Math.floor(options.appMemory * 0.75)),
          rssMiB: options.appMemory,
          stallMs: Math.round(options.appStall * 1000),
          maxResponseBytes: options.maxResponseBytes
        },
        shutdownGraceMs: Math.round(options.shutdownGrace * 1000),
        executorGraceMs: Math.round(options.executorGrace * 1000),
        ...(options.autoscale ? { autoscaleIntervalMs: Math.round(options.autoscaleInterval * 1000) } : {}),
        idleReleaseS: options.idleRelease,
        unregisterGraceMs: Math.round(options.shutdownGrace * 1000)
      })
    })
).pipe(Command.withDescription("Run the platform on this machine: gateway, control plane and executors."))

const register = Command.make(
  "register",
  {
    file: Args.file({ name: "FILE", exists: "yes" }).pipe(Args.withDescription("The app's TypeScript file.")),
    name: Options.text("name").pipe(
      Options.withDescription("The app's id (default: the file's stem)."),
      Options.optional
    ),
    replace: Options.boolean("replace").pipe(
      Options.withDescription("Swap in this version of an app already registered under the name.")
    ),
    maxConcurrency: Options.integer("max-concurrency").pipe(
      Options.withDescription("Requests the app may run at once (over its own `admission`); more get 429 or wait."),
      Options.optional
    ),
    maxQueue: Options.integer("max-queue").pipe(
      Options.withDescription("Requests that may wait for a turn once max-concurrency run (default 0)."),
      Options.optional
    ),
    queueTimeout: Options.float("queue-timeout").pipe(
      Options.withDescription(
        "Seconds a queued request may wait before it gets 503 (default 10; 0.5 is half a second)."
      ),
      Options.optional
    ),
    timeout: Options.float("timeout").pipe(
      Options.withDescription(
        "Seconds a request may take, its stream included, over the app's own `timeoutMs` (default: serve --request-timeout)."
      ),
      Options.optional
    ),
    weight: Options.float("weight").pipe(
      Options.withDescription(
        "The app's share of tasks it shares with other apps, against theirs (default 1): executors serve apps by weighted fair queuing."
      ),
      Options.optional
    ),
    maxCallsPerTask: Options.integer("max-calls-per-task").pipe(
      Options.withDescription("Calls the app may have in flight to any one task; more wait at the dispatcher."),
      Options.optional
    ),
    apiKeys: Options.text("api-key").pipe(
      Options.withDescription(
        "A key this app's invoke and OpenAI routes take as `Authorization: Bearer KEY`, besides the platform's " +
          "(repeatable; 16 to 256 printable characters); the platform keeps only its SHA-256."
      ),
      Options.repeated
    ),
    noCheck: Options.boolean("no-check").pipe(
      Options.withDescription("Register the app without type-checking it first.")
    ),
    dryRun: Options.boolean("dry-run").pipe(
      Options.withDescription(
        "Bundle and check the app as register does, then list every file that would be sent, its size and the " +
          "total; send nothing."
      )
    ),
    allowHosts: Options.text("allow-host").pipe(
      Options.withDescription(
        "A host the app may connect to through `outbound.fetch` or `outbound.connect` of `cornserve/app`: " +
          "HOST (any port) or HOST:PORT (repeatable, at most 32). Apps reach no other network."
      ),
      Options.repeated
    ),
    gateway: gatewayOption
  },
  ({
    file,
    name,
    replace,
    maxConcurrency,
    maxQueue,
    queueTimeout,
    timeout,
    weight,
    maxCallsPerTask,
    apiKeys,
    allowHosts,
    noCheck,
    dryRun,
    gateway
  }) => {
    if (dryRun) return previewRegistration(file, Option.getOrUndefined(name), !noCheck)
    const admission = {
      ...Option.match(maxConcurrency, { onNone: () => ({}), onSome: (value) => ({ maxConcurrency: value }) }),
      ...Option.match(maxQueue, { onNone: () => ({}), onSome: (value) => ({ maxQueue: value }) }),
      ...Option.match(queueTimeout, {
        onNone: () => ({}),
        onSome: (value) => ({ queueTimeoutMs: Math.round(value * 1000) })
      }),
      ...Option.match(weight, { onNone: () => ({}), onSome: (value) => ({ weight: value }) }),
      ...Option.match(maxCallsPerTask, { onNone: () => ({}), onSome: (value) => ({ maxCallsPerTask: value }) })
    }
    return registerApp(
      target(gateway),
      file,
      Option.getOrUndefined(name),
      replace,
      Object.keys(admission).length > 0 ? admission : undefined,
      apiKeys,
      allowHosts,
      Option.match(timeout, { onNone: () => undefined, onSome: (seconds) => Math.round(seconds * 1000) }),
      !noCheck
    )
  }
).pipe(Command.withDescription("Register an app (admin token from CORNSERVE_ADMIN_TOKEN)."))

const unregister = Command.make(
  "unregister",
  {
    appId: Args.text({ name: "ID" }).pipe(Args.withDescription("The app's id, as app list shows it.")),
    gateway: gatewayOption
  },
  ({ appId, gateway }) => unregisterApp(target(gateway), appId)
).pipe(Command.withDescription("Unregister an app once its requests in flight finish."))

const list = Command.make("list", { gateway: gatewayOption }, ({ gateway }) => listApps(target(gateway))).pipe(
  Command.withDescription("List registered apps and their states.")
)

const logs = Command.make(
  "logs",
  {
    appId: Args.text({ name: "ID" }).pipe(Args.withDescription("The app's id, as app list shows it.")),
    follow: Options.boolean("follow").pipe(
      Options.withAlias("f"),
      Options.withDescription("Keep printing the app's lines as it writes them (across its restarts and replacements).")
    ),
    gateway: gatewayOption
  },
  ({ appId, follow, gateway }) => appLogs(target(gateway), appId, follow)
).pipe(Command.withDescription("Print the last lines an app wrote to its stdout and stderr (the last 64 KiB)."))

const check = Command.make(
  "check",
  { file: Args.file({ name: "FILE", exists: "yes" }).pipe(Args.withDescription("The app's TypeScript file.")) },
  ({ file }) => checkAppFile(file)
).pipe(
  Command.withDescription(
    "Type-check an app against the SDK's declarations, as app register does; prints file:line:col for each error."
  )
)

const dev = Command.make(
  "dev",
  {
    file: Args.file({ name: "FILE", exists: "yes" }).pipe(Args.withDescription("The app's TypeScript file.")),
    name: Options.text("name").pipe(
      Options.withDescription("The app's id (default: the file name without .ts)."),
      Options.optional
    ),
    gateway: gatewayOption
  },
  ({ file, name, gateway }) => developApp(target(gateway), file, Option.getOrUndefined(name))
).pipe(
  Command.withDescription(
    "Register an app and register it again (--replace) each time its folder changes; print its errors and its log."
  )
)

const invoke = Command.make(
  "invoke",
  {
    appId: Args.text({ name: "ID" }).pipe(Args.withDescription("The app's id, as app list shows it.")),
    data: Options.text("data").pipe(Options.withDescription("The request: JSON, @file, or - for standard input.")),
    aggregate: Options.text("aggregate").pipe(
      Options.withDescription(
        "For streaming apps: print one field of every line, concatenated (a dot path, e.g. choices.0.delta.content)."
      ),
      Options.optional
    ),
    gateway: gatewayOption
  },
  ({ appId, data, aggregate, gateway }) => invokeApp(target(gateway), appId, data, Option.getOrUndefined(aggregate))
).pipe(Command.withDescription("Call an app; prints its JSON answer, or its lines as they stream."))

const describe = Command.make(
  "describe",
  {
    appId: Args.text({ name: "ID" }).pipe(Args.withDescription("The app's id, as app list shows it.")),
    json: Options.boolean("json").pipe(Options.withDescription("Print the app's OpenAPI 3.1 document instead.")),
    gateway: gatewayOption
  },
  ({ appId, json, gateway }) => describeApp(target(gateway), appId, json)
).pipe(
  Command.withDescription(
    "Print what an app does, the request it takes, the answer it gives and its example (its /app/ID/openapi.json)."
  )
)

const app = Command.make("app").pipe(
  Command.withDescription("Register, list, describe, call and unregister apps, and read their logs."),
  Command.withSubcommands([register, check, dev, unregister, list, describe, logs, invoke])
)

const tasks = Command.make("tasks").pipe(
  Command.withDescription("Inspect deployed unit tasks."),
  Command.withSubcommands([
    Command.make("list", { gateway: gatewayOption }, ({ gateway }) => listTasks(target(gateway))).pipe(
      Command.withDescription("List deployed unit tasks, their settings, the apps that use them and their devices.")
    ),
    Command.make(
      "show",
      {
        taskId: Args.text({ name: "task-id" }).pipe(
          Args.withDescription("The task's id or name, as tasks list shows them.")
        ),
        json: Options.boolean("json").pipe(Options.withDescription("Print the task as JSON.")),
        gateway: gatewayOption
      },
      ({ taskId, json, gateway }) => showTask(target(gateway), taskId, json)
    ).pipe(
      Command.withDescription(
        "Show one task: its config as its app declared it, and the settings its executors run with (the config's over serve's defaults)."
      )
    ),
    Command.make(
      "scale",
      {
        taskId: Args.text({ name: "task-id" }).pipe(
          Args.withDescription("The task's id or name, as tasks list shows them.")
        ),
        devices: Args.text({ name: "devices" }).pipe(
          Args.withDescription("Devices to add (+N) or take away (-N); a task keeps at least one executor."),
          Args.mapEffect((text) =>
            /^[+-]?[1-9]\d*$/.test(text)
              ? Effect.succeed(Number(text))
              : Effect.fail(HelpDoc.p(`"${text}" is not a change of devices such as +1 or -1`))
          )
        ),
        gateway: gatewayOption
      },
      ({ taskId, devices, gateway }) => scaleTask(target(gateway), taskId, devices)
    ).pipe(
      Command.withDescription(
        "Give a task more devices (new executors) or fewer (those executors drain first); kept across restarts."
      )
    ),
    Command.make(
      "profile",
      {
        taskId: Args.text({ name: "task-id" }).pipe(
          Args.withDescription("The task's id or name, as tasks list shows them.")
        ),
        json: Options.boolean("json").pipe(Options.withDescription("Print the profile as JSON.")),
        record: Options.boolean("record").pipe(
          Options.withDescription(
            "Record the task's profile now: keep each load level of synthetic calls in flight against its executors for a while, measuring each; the curve is kept in the state dir (admin token from CORNSERVE_ADMIN_TOKEN)."
          )
        ),
        levels: Options.text("levels").pipe(
          Options.withDescription(
            `With --record: the load levels, calls in flight, comma-separated (default ${defaultLevels.join(",")}).`
          ),
          Options.filterMap((text) => {
            const words = text.split(",").map((level) => level.trim())
            const levels = words.map(Number)
            return words.every((word) => /^[1-9]\d{0,3}$/.test(word)) &&
              levels.every((level) => level <= 1024) &&
              Arr.isNonEmptyArray(levels)
              ? Option.some(levels)
              : Option.none()
          }, "--levels must be whole numbers from 1 to 1024, comma-separated, such as 1,2,4,8"),
          Options.optional
        ),
        secondsPerLevel: Options.float("seconds-per-level").pipe(
          Options.withDescription(
            `With --record: how long each load level is kept, in seconds (default ${defaultSecondsPerLevel}).`
          ),
          Options.filterMap(
            (value) => (value > 0 && value <= 600 ? Option.some(value) : Option.none()),
            "--seconds-per-level must be a number of seconds over 0, at most 600"
          ),
          Options.optional
        ),
        gateway: gatewayOption
      },
      ({ taskId, json, record, levels, secondsPerLevel, gateway }) =>
        Effect.gen(function* () {
          const sweep = {
            ...Option.match(levels, { onNone: () => ({}), onSome: (value) => ({ levels: value }) }),
            ...Option.match(secondsPerLevel, { onNone: () => ({}), onSome: (value) => ({ secondsPerLevel: value }) })
          }
          if (record) return yield* recordTaskProfile(target(gateway), taskId, sweep, json)
          if (Object.keys(sweep).length > 0) {
            const misuse = "--levels and --seconds-per-level go with --record"
            yield* Console.error(`cornserve: ${misuse}`)
            return yield* Effect.fail(ValidationError.invalidValue(HelpDoc.p(misuse)))
          }
          return yield* showTaskProfile(target(gateway), taskId, json)
        })
    ).pipe(
      Command.withDescription(
        "What a task's calls have shown: latency by load level per executor count (the throughput–latency curve), calls/s, queue depth; and the curve recorded ahead of time (--record records one)."
      )
    )
  ])
)

const nodes = Command.make("nodes").pipe(
  Command.withDescription("Inspect the platform's nodes."),
  Command.withSubcommands([
    Command.make("list", { gateway: gatewayOption }, ({ gateway }) => listNodes(target(gateway))).pipe(
      Command.withDescription("List the nodes: name, role, address, state (ready, lost) and devices.")
    )
  ])
)

const sidecarCommand = Command.make(
  "sidecar",
  {
    nodeId: Options.text("node-id").pipe(
      Options.withDescription("This node's id, as its peers and executors name it.")
    ),
    socket: Options.text("socket").pipe(Options.withDescription("The Unix socket executors of this node connect to.")),
    arenaPath: Options.text("arena-path").pipe(
      Options.withDescription(
        "The shared-memory file (default /dev/shm/cornserve-arena-<node id>-<pid>); removed on exit."
      ),
      Options.optional
    ),
    arenaBytes: Options.integer("arena-bytes").pipe(
      Options.withDescription("The arena's size in bytes."),
      Options.withDefault(2 ** 30)
    ),
    peerHost: Options.text("peer-host").pipe(
      Options.withDescription("The address the peer port listens on."),
      Options.withDefault("127.0.0.1")
    ),
    peerPort: Options.integer("peer-port").pipe(
      Options.withDescription("The TCP port peer sidecars connect to (0 picks a free one)."),
      Options.withDefault(0)
    ),
    peers: Options.text("peers").pipe(
      Options.withDescription("Peer sidecars: node-id=host:port, comma-separated."),
      Options.withDefault("")
    ),
    ttl: seconds("ttl", 300, "Seconds a received chunk may stay without being marked done before it is reclaimed."),
    peerTimeout: seconds("peer-timeout", 10, "Seconds a send waits for a peer sidecar to be connected.")
  },
  (options) =>
    // Loaded on demand, like serve: the sidecar process needs nothing of the control plane.
    Effect.flatMap(
      Effect.promise(() => import("../sidecar/SidecarCommand.js")),
      ({ runSidecar }) =>
        runSidecar({
          nodeId: options.nodeId,
          socketPath: options.socket,
          ...Option.match(options.arenaPath, { onNone: () => ({}), onSome: (arenaPath) => ({ arenaPath }) }),
          arenaBytes: options.arenaBytes,
          peerHost: options.peerHost,
          peerPort: options.peerPort,
          peers: options.peers,
          ttlMs: options.ttl * 1000,
          peerTimeoutMs: options.peerTimeout * 1000
        })
    )
).pipe(Command.withDescription("Run this node's tensor sidecar: the shared-memory arena and the peer port."))

const executorCommand = Command.make(
  "executor",
  {
    kind: Options.choice("kind", ["eric", "geri", "llm"]).pipe(
      Options.withDescription("Which executor: the encoder (eric), the generator (geri) or the LLM.")
    ),
    model: Options.text("model").pipe(Options.withDescription("A built-in model name or a model directory.")),
    dtype: Options.choice("dtype", dtypes).pipe(
      Options.withDescription(
        "LLM: which ONNX export to run (model_q4.onnx is q4); default fp32, or the closest there is."
      ),
      Options.optional
    ),
    devices: Options.text("devices").pipe(
      Options.withDescription("Its devices, one worker each: cpu:0,cpu:1 or cuda:0."),
      Options.withDefault(executorDefaults.devices)
    ),
    threadsPerDevice: Options.integer("threads-per-device").pipe(
      Options.withDescription("ONNX Runtime threads of each CPU worker."),
      Options.withDefault(executorDefaults.threadsPerDevice)
    ),
    host: Options.text("host").pipe(
      Options.withDescription("The address its HTTP API listens on."),
      Options.withDefault(executorDefaults.host)
    ),
    port: Options.integer("port").pipe(
      Options.withDescription("Its HTTP port (0 picks a free one)."),
      Options.withDefault(executorDefaults.port)
    ),
    sidecarSocket: Options.text("sidecar-socket").pipe(
      Options.withDescription("The node's sidecar socket, for tensors to and from other executors."),
      Options.optional
    ),
    maxBatchSize: Options.integer("max-batch-size").pipe(
      Options.withDescription("Items in one batch."),
      Options.withDefault(executorDefaults.maxBatchSize)
    ),
    maxBatchDelayMs: Options.float("max-batch-delay-ms").pipe(
      Options.withDescription("How long a small batch may wait to fill."),
      Options.withDefault(executorDefaults.maxBatchDelayMs)
    ),
    maxQueue: Options.integer("max-queue").pipe(
      Options.withDescription("Requests waiting or running; more are answered 503."),
      Options.withDefault(executorDefaults.maxQueuedRequests)
    ),
    preprocessThreads: Options.integer("preprocess-threads").pipe(
      Options.withDescription("Threads that decode and preprocess media."),
      Options.withDefault(executorDefaults.preprocessThreads)
    ),
    mediaRoot: Options.directory("media-root").pipe(
      Options.withDescription("file: media URLs may be read below this directory only."),
      Options.optional
    ),
    allowPrivateHosts: Options.boolean("allow-private-hosts").pipe(
      Options.withDescription("Fetch http(s) media from loopback and private addresses too.")
    ),
    maxMediaBytes: Options.integer("max-media-bytes").pipe(
      Options.withDescription("The largest media item accepted (413 beyond)."),
      Options.withDefault(executorDefaults.maxMediaBytes)
    ),
    maxMediaItems: Options.integer("max-media-items").pipe(
      Options.withDescription("Media items in one request, counted before any is read (400 beyond)."),
      Options.withDefault(defaultMaxMediaItems)
    ),
    maxImagePixels: Options.integer("max-image-pixels").pipe(
      Options.withDescription("Pixels of an image, or of all the frames of an animated image together (413 beyond)."),
      Options.withDefault(defaultMediaLimits.maxImagePixels)
    ),
    maxAnimationFrames: Options.integer("max-animation-frames").pipe(
      Options.withDescription("Frames of an animated image taken as a video, before sampling (413 beyond)."),
      Options.withDefault(defaultMediaLimits.maxAnimationFrames)
    ),
    maxAudioSeconds: Options.float("max-audio-seconds").pipe(
      Options.withDescription("Length of an audio clip, read from its header before decoding (413 beyond)."),
      Options.withDefault(defaultMediaLimits.maxAudioSeconds)
    ),
    maxVideoSeconds: Options.float("max-video-seconds").pipe(
      Options.withDescription("Length of a video (mp4, mov, webm), read from its header before decoding (413 beyond)."),
      Options.withDefault(defaultMediaLimits.maxVideoSeconds)
    ),
    maxVideoFrames: Options.integer("max-video-frames").pipe(
      Options.withDescription("Frames of a video (mp4, mov, webm), counted before any is decoded (413 beyond)."),
      Options.withDefault(defaultMediaLimits.maxVideoFrames)
    ),
    batchSlotBytes: Options.integer("batch-slot-bytes").pipe(
      Options.withDescription("Shared memory for one batch between engine and workers."),
      Options.withDefault(executorDefaults.batchSlotBytes)
    ),
    embeddingWaitMs: Options.integer("embedding-wait-ms").pipe(
      Options.withDescription("How long to wait for an embedding from the sidecar (404 after)."),
      Options.withDefault(executorDefaults.embeddingWaitMs)
    ),
    runDir: Options.text("run-dir").pipe(
      Options.withDescription(
        "A private directory for its sockets (default: a new one in the temporary directory); removed when it stops."
      ),
      Options.optional
    ),
    kvCacheBytes: Options.integer("kv-cache-bytes").pipe(
      Options.withDescription(
        "LLM: bytes of KV cache per device, the running requests' and the prefix cache's together; requests are admitted by it and the cache never grows past it (default: max batch size requests at the context length, plus the prefix cache's bytes)."
      ),
      Options.optional
    ),
    prefixCacheBytes: Options.integer("prefix-cache-bytes").pipe(
      Options.withDescription(
        "LLM: bytes of KV cache kept per device for prompts' prefixes (a repeated system prompt, a chat's earlier turns), least recently used out; 0 keeps none (default 512 MiB)."
      ),
      Options.optional
    ),
    prefillChunkTokens: Options.integer("prefill-chunk-tokens").pipe(
      Options.withDescription(
        "LLM: prompt tokens a step prefills while other requests decode (default: as many as take no longer than their decode step, so that a long prompt holds running streams back little); 0 prefills each prompt whole."
      ),
      Options.optional
    ),
    kvCacheMode: Options.choice("kv-cache-mode", ["shared", "copies"]).pipe(
      Options.withDescription(
        "LLM: keep the KV cache in buffers the executor owns, the decoder's attention rewritten at load time to read them in place (the default, where the decoder's graph matches the exporters' attention; else it runs as exported, and /v1/cornserve/stats says why), or run the decoder as exported, copying the whole cache at every step."
      ),
      Options.optional
    ),
    quantizedRows: Options.choice("quantized-rows", ["apart", "per-row"]).pipe(
      Options.withDescription(
        "LLM, 8-bit exports that quantise activations per tensor: run each request apart, answering exactly as alone (the default), or batch decode steps with a scale per row (about 2.4x the throughput of 8 concurrent requests; answers then differ from alone by float rounding, which 8-bit activations can turn into another token at a near-tie)."
      ),
      Options.optional
    ),
    q4Activations: Options.choice("q4-activations", ["exported", "int8"]).pipe(
      Options.withDescription(
        "LLM, 4-bit exports (MatMulNBits): compute with the activations in fp32, as the export does (exact, the default), or quantised to 8 bits per row, as ONNX Runtime's accuracy level 4 does (about 2x the decode speed at 1B; a request's answer does not depend on its batch, but may part from transformers.js's at a near-tie)."
      ),
      Options.optional
    ),
    settings: Options.text("settings").pipe(
      Options.withDescription(
        "Its batches, threads and KV cache as one JSON record (how the platform starts it); fields it names replace the flags above."
      ),
      Options.optional
    )
  },
  (options) =>
    Effect.flatMap(
      Effect.promise(() => import("../executors/common/ExecutorCommand.js")),
      ({ runExecutor }) =>
        runExecutor({
          kind: options.kind,
          model: options.model,
          devices: deviceList(options.devices),
          threadsPerDevice: options.threadsPerDevice,
          host: options.host,
          port: options.port,
          maxBatchSize: options.maxBatchSize,
          maxBatchDelayMs: options.maxBatchDelayMs,
          maxQueuedRequests: options.maxQueue,
          batchSlotBytes: options.batchSlotBytes,
          preprocessThreads: options.preprocessThreads,
          allowPrivateHosts: options.allowPrivateHosts,
          maxMediaBytes: options.maxMediaBytes,
          maxMediaItems: options.maxMediaItems,
          maxImagePixels: options.maxImagePixels,
          maxAnimationFrames: options.maxAnimationFrames,
          maxAudioSeconds: options.maxAudioSeconds,
          maxVideoSeconds: options.maxVideoSeconds,
          maxVideoFrames: options.maxVideoFrames,
          embeddingWaitMs: options.embeddingWaitMs,
          ...Option.match(options.kvCacheBytes, {
            onNone: () => ({}),
            onSome: (kvCacheBytes) => ({ kvCacheBytes })
          }),
          ...Option.match(options.prefixCacheBytes, {
            onNone: () => ({}),
            onSome: (prefixCacheBytes) => ({ prefixCacheBytes })
          }),
          ...Option.match(options.prefillChunkTokens, {
            onNone: () => ({}),
            onSome: (prefillChunkTokens) => ({ prefillChunkTokens })
          }),
          ...Option.match(options.kvCacheMode, {
            onNone: () => ({}),
            onSome: (kvCacheMode) => ({ kvCacheMode })
          }),
          ...Option.match(options.quantizedRows, {
            onNone: () => ({}),
            onSome: (quantizedRows) => ({ quantizedRows })
          }),
          ...Option.match(options.q4Activations, {
            onNone: () => ({}),
            onSome: (q4Activations) => ({ q4Activations })
          }),
          ...Option.match(options.runDir, { onNone: () => ({}), onSome: (runDir) => ({ runDir }) }),
          ...Option.match(options.dtype, { onNone: () => ({}), onSome: (dtype) => ({ dtype }) }),
          ...Option.match(options.sidecarSocket, {
            onNone: () => ({}),
            onSome: (sidecarSocket) => ({ sidecarSocket })
          }),
          ...Option.match(options.mediaRoot, { onNone: () => ({}), onSome: (mediaRoot) => ({ mediaRoot }) }),
          ...Option.match(options.settings, { onNone: () => ({}), onSome: (settings) => ({ settings }) })
        })
    )
).pipe(Command.withDescription("Run a task executor: its router (HTTP) and its engine, which start its workers."))

const executorWorkerCommand = Command.make(
  "executor-worker",
  { rank: Options.integer("rank").pipe(Options.withDescription("Which of the executor's devices it runs on.")) },
  ({ rank }) =>
    Effect.flatMap(
      Effect.promise(() => import("../executors/common/ExecutorCommand.js")),
      ({ runExecutorWorker }) => runExecutorWorker(rank)
    )
).pipe(Command.withDescription("An executor's worker on one device (started by its router)."))

const pullCommand = Command.make(
  "pull",
  {
    id: Args.text({ name: "ID" }).pipe(Args.withDescription("A hub model id: org/name or org/name@revision.")),
    dtype: Options.choice("dtype", dtypes).pipe(
      Options.withDescription("The ONNX precision to fetch (default: fp32, or the least lossy one the model has)."),
      Options.optional
    ),
    offline: Options.boolean("offline").pipe(
      Options.withDescription("Only look on this machine; never download (also HF_HUB_OFFLINE=1).")
    ),
    dir: Options.directory("dir").pipe(
      Options.withDescription("Where models go (default: CORNSERVE_MODEL_DIR or ~/.cache/cornserve/models)."),
      Options.optional
    )
  },
  ({ id, dtype, offline, dir }) =>
    Effect.flatMap(
      Effect.promise(() => import("./models.js")),
      ({ pullModel }) =>
        pullModel(id, { dtype: Option.getOrUndefined(dtype), offline, dir: Option.getOrUndefined(dir) })
    )
).pipe(
  Command.withDescription(
    "Download a model from the hub (HF_ENDPOINT, HF_TOKEN) into the model cache, resuming a broken download; " +
      "prints its directory."
  )
)

const models = Command.make("models").pipe(
  Command.withDescription("Build the built-in models; download models from the hub."),
  Command.withSubcommands([
    Command.make(
      "build",
      {
        names: Args.text({ name: "NAME" }).pipe(
          Args.withDescription("Models to build (default: every built-in; bench/* presets only when named)."),
          Args.repeated
        ),
        dir: Options.directory("dir").pipe(
          Options.withDescription("Where to build (default: CORNSERVE_MODEL_DIR or ~/.cache/cornserve/models)."),
          Options.optional
        )
      },
      ({ names, dir }) =>
        Effect.flatMap(
          Effect.promise(() => import("./models.js")),
          ({ buildModels }) => buildModels(names, Option.getOrUndefined(dir))
        )
    ).pipe(
      Command.withDescription(
        "Build models into the model cache (or --dir); the same recipe always gives the same bytes."
      )
    ),
    pullCommand
  ])
)

const internal = Command.make("internal").pipe(
  Command.withDescription("Processes that cornserve starts by itself; not meant to be run by hand."),
  Command.withSubcommands([sidecarCommand, executorCommand, executorWorkerCommand])
)

const init = Command.make(
  "init",
  { dir: Args.directory({ name: "DIR" }).pipe(Args.withDescription("A new folder for the app (created).")) },
  ({ dir }) =>
    Effect.tryPromise({
      try: () => initAppFolder(dir),
      catch: (error) => new Error((error as Error).message)
    }).pipe(
      Effect.flatMap((files) =>
        Console.log(
          `wrote ${files.map((file) => join(dir, file)).join(", ")}\n` +
            `next: cd ${dir} && npm install && npx tsc --noEmit, then cornserve app dev app.ts`
        )
      )
    )
).pipe(
  Command.withDescription(
    "Write an app folder (app.ts, package.json, tsconfig.json) that type-checks against this installation's SDK."
  )
)

const cornserve = Command.make("cornserve").pipe(
  Command.withDescription("Serve multimodal ML apps: register an app written in TypeScript, then call it over HTTP."),
  Command.withSubcommands([serveCommand, init, app, tasks, nodes, models, internal])
)

const cli = Command.run(cornserve, { name: "cornserve", version })

/** What a failed command says: its message, or (an error with none, such as a server's) its cause's. */
const failureMessage = (error: unknown): string => {
  // client.js's CliFailure, known by its tag: that module is loaded only by the commands that use it.
  if ((error as { readonly _tag?: unknown } | undefined)?._tag === "CliFailure") return (error as Error).message
  const { message, cause } = (error ?? {}) as { readonly message?: unknown; readonly cause?: unknown }
  if (typeof message === "string" && message !== "") return message
  if (cause !== undefined && cause !== error) return failureMessage(cause)
  return String(error)
}

export const main = (argv: ReadonlyArray<string>) =>
  cli(argv).pipe(
    Effect.catchAllCause((cause) => {
      // Ctrl-C: the command stopped as asked.
      if (Cause.isInterruptedOnly(cause)) return Effect.void
      const error = Cause.squash(cause)
      // A wrong command line (already explained by the parser) exits 2, as usage errors do.
      if (ValidationError.isValidationError(error)) {
        process.exitCode = 2
        return Effect.void
      }
      process.exitCode = 1
      // A failure or a defect alike: whoever started this process (the node agent, a user) needs its reason.
      return Console.error(`cornserve: ${failureMessage(error)}`)
    }),
    Effect.provide(NodeContext.layer),
    withTidyHelp,
    runMain({
      disableErrorReporting: true,
      // A failed command exits at once with its code: open handles (a parent watched through
      // stdin, a half-started child) must not keep a failed process alive.
      teardown: (exit, onExit) =>
        onExit(Exit.isFailure(exit) && !Cause.isInterruptedOnly(exit.cause) ? 1 : Number(process.exitCode ?? 0))
    })
  )
