import * as ort from "onnxruntime-node"
import { type DType, Tensor } from "../../sidecar/Tensor.js"
import { copyLabel, keptCopy, newCopy, type PackedWeightsUse, packedWeightsName, removeCopy } from "./PackedWeights.js"

/**
 * ONNX Runtime 1.30's Linux build starts Microsoft's telemetry with its first session: it keeps
 * events and a device id under `~/.cache/Microsoft/DeveloperTools`, leaves an empty
 * `/tmp/mat-debug-<pid>.log` behind every process, and uploads over HTTPS when it can. A serving
 * platform on its users' machines sends nothing and leaves nothing: it is off unless the operator
 * set `ORT_DISABLE_TELEMETRY` themselves (to `0` to let it run). Read when the runtime's environment
 * is made, at the first session, so setting it here, before that, is enough.
 */
export const onnxRuntimeTelemetryOff = (env: NodeJS.ProcessEnv = process.env): void => {
  if (env.ORT_DISABLE_TELEMETRY === undefined) env.ORT_DISABLE_TELEMETRY = "1"
}

/**
 * An ONNX Runtime session on one device: the CPU provider with a fixed thread count, or CUDA device
 * N. With `spin: false` its threads sleep as soon as a run ends instead of spinning for more work:
 * for a session that runs now and then beside another on the same cores (a VLM's vision encoder
 * before its decoder), whose spinning threads would take the cores the other's run needs.
 */
export const createSession = (
  /** The model file, or its bytes (a model rewritten at load time). */
  path: string | Uint8Array,
  device: string,
  threads: number,
  options: {
    readonly spin?: boolean
    /** For a model given as bytes whose weights are in external data files: the folder they are in. */
    readonly externalDataFolder?: string
    /**
     * Where ONNX Runtime writes a profile of every node of every run (`<prefix>_<time>.json`,
     * Chrome's trace format), written when the session is released: a bench's, as it slows each run.
     */
    readonly profilePrefix?: string
    /** Where ONNX Runtime writes the optimized model with its packed weights (PackedWeights.ts's `newCopy`). */
    readonly saveOptimized?: {
      readonly optimizedModelFilePath: string
      readonly sessionConfig: Readonly<Record<string, string>>
    }
  } = {}
): Promise<ort.InferenceSession> => {
  onnxRuntimeTelemetryOff()
  const [type, index] = device.split(":")
  const executionProviders: ort.InferenceSession.SessionOptions["executionProviders"] =
    type === "cuda" ? [{ name: "cuda", deviceId: Number(index) }] : ["cpu"]
  const sessionOptions: ort.InferenceSession.SessionOptions = {
    executionProviders,
    intraOpNumThreads: threads,
    interOpNumThreads: 1,
    graphOptimizationLevel: "all",
    ...(options.profilePrefix === undefined ? {} : { enableProfiling: true, profileFilePrefix: options.profilePrefix }),
    // Saving, ONNX Runtime warns that the optimized model may hold this CPU's instructions: the copy's
    // name holds the processor (PackedWeights.ts), so only errors are worth printing then.
    ...(options.saveOptimized === undefined
      ? {}
      : { optimizedModelFilePath: options.saveOptimized.optimizedModelFilePath, logSeverityLevel: 3 as const }),
    extra: {
      session: {
        ...options.saveOptimized?.sessionConfig,
        ...(options.spin === false ? { intra_op: { allow_spinning: "0" } } : {}),
        ...(options.externalDataFolder === undefined
          ? {}
          : { model_external_initializers_file_folder_path: options.externalDataFolder })
      }
    }
  }
  return typeof path === "string"
    ? ort.InferenceSession.create(path, sessionOptions)
    : ort.InferenceSession.create(path, sessionOptions)
}

/**
 * A decoder's session on the CPU whose packed weights are kept in `packed.dir` (PackedWeights.ts):
 * opened from its kept copy when there is one, else made from `graph` and its copy written. Where
 * the copy cannot be written or opened, the session is made as `createSession` makes it.
 */
export const createPackedSession = async (
  graph: Uint8Array,
  device: string,
  threads: number,
  options: Parameters<typeof createSession>[3] & { readonly externalDataFolder: string },
  packed: { readonly dir: string; readonly decoder: string }
): Promise<{
  readonly session: ort.InferenceSession
  readonly packedWeights: PackedWeightsUse
  readonly copy: string
}> => {
  const name = packedWeightsName(packed.decoder, graph, options.externalDataFolder, ort.env.versions.common ?? "")
  const copy = copyLabel(packed.dir, name)
  const kept = keptCopy(packed.dir, name)
  if (kept !== undefined) {
    try {
      const { externalDataFolder: _, ...rest } = options
      return { session: await createSession(kept, device, threads, rest), packedWeights: "mapped", copy }
    } catch {
      // A copy cut short or made by something else: written again below.
      await removeCopy(packed.dir, name)
    }
  }
  let target: Awaited<ReturnType<typeof newCopy>> | undefined
  try {
    target = await newCopy(packed.dir, name)
  } catch {
    return { session: await createSession(graph, device, threads, options), packedWeights: "packed", copy }
  }
  let session: ort.InferenceSession
  try {
    session = await createSession(graph, device, threads, { ...options, saveOptimized: target })
  } catch {
    // No room for the copy, or a folder it cannot be written to: the decoder loads as it would without one.
    await target.discard()
    return { session: await createSession(graph, device, threads, options), packedWeights: "packed", copy }
  }
  try {
    await target.keep()
    return { session, packedWeights: "saved", copy }
  } catch {
    // The session is made; only its copy could not take its place.
    await target.discard()
    return { session, packedWeights: "packed", copy }
  }
}

/** A tensor (over any memory, the batch buffer included) as ONNX Runtime's input. */
export const toOrt = (tensor: Tensor): ort.Tensor =>
  new ort.Tensor(tensor.dtype as ort.Tensor.Type, tensor.data as ort.Tensor.DataType, [...tensor.shape])

/** ONNX Runtime's output as a tensor. */
export const fromOrt = (tensor: ort.Tensor): Tensor =>
  new Tensor(tensor.type as DType, tensor.dims, tensor.data as never)

/** A Qwen2-VL vision encoder's grid input: grid_thw (Qwen2-VL's export) or image_grid_thw (Qwen2.5-VL's). */
export const qwen2VLGridInput = (session: { readonly inputNames: ReadonlyArray<string> }): string | undefined =>
  ["grid_thw", "image_grid_thw"].find((name) => session.inputNames.includes(name))
