/**
 * The LLM executor's worker: a Runner on its device (a JanusRunner for a Janus model, whose tokens
 * are an image's; a TalkerRunner for a talker, whose are codec frames), driven one step at a time by the LLM engine.
 * Each batch the framework hands it is one step; its tokens go back as partial results the moment
 * they are sampled. Prompt embeddings go to the sidecar under the request's id.
 *
 * A traced request is one span here from its prefill to its last token (or its cache freed), as
 * its compute spans many steps, batched with whichever other requests run then.
 */
import { isJanus } from "../../models/JanusModel.js"
import { isTalker } from "../../models/TalkerModel.js"
import { loadModelDirectory } from "../../models/ModelDirectory.js"
import { SidecarClient } from "../../sidecar/SidecarClient.js"
import { Tensor } from "../../sidecar/Tensor.js"
import { noSpan, type Span, startSpan } from "../../tracing/Tracing.js"
import { packedWeightsDirEnvName } from "../common/PackedWeights.js"
import type { LoadWorkerModel } from "../common/WorkerModel.js"
import { checkPrefix, exportPrefix, importedPast } from "./PrefixTransfer.js"
import type { EmbedResult, KvResult, StatesStream, StepOp, TokenPartial, WorkerStats } from "./protocol.js"
import { JanusRunner } from "./JanusRunner.js"
import { kvBudget } from "./Limits.js"
import type { CacheArray, PastData } from "./PastCache.js"
import { Runner } from "./Runner.js"
import { TalkerRunner } from "./TalkerRunner.js"
import type { StepRunner } from "./StepRunner.js"

/** A request's imported cache has arrived whole when the router submits it: reading it waits no longer than this. */
const importWaitMs = 5000

export const load: LoadWorkerModel<StepOp, EmbedResult | KvResult | WorkerStats | undefined, TokenPartial> = async ({
  config,
  device,
  rank
}) => {
  const model = await loadModelDirectory(config.modelDir)
  const budget = kvBudget(config, model)
  const packedWeightsDir = process.env[packedWeightsDirEnvName] || undefined
  const sidecar = config.sidecarSocket === undefined ? undefined : await SidecarClient.connect(config.sidecarSocket)
  const runner: StepRunner = isJanus(model)
    ? await JanusRunner.open(model, device, config.threadsPerDevice, config.dtype)
    : isTalker(model)
      ? await TalkerRunner.open(model, device, config.threadsPerDevice, sidecar, config.embeddingWaitMs)
      : await Runner.open(model, device, config.threadsPerDevice, config.dtype, {
          prefixCacheBytes: budget.prefixBytes,
          kvStoreBytes: budget.rowBytes,
          ...(config.prefillChunkTokens === undefined ? {} : { chunkTokens: config.prefillChunkTokens }),
          ...(config.quantizedRows === undefined ? {} : { quantizedRows: config.quantizedRows }),
          ...(config.kvCacheMode === undefined ? {} : { kvCache: config.kvCacheMode }),
          ...(config.q4Activations === undefined ? {} : { q4Activations: config.q4Activations }),
          ...(packedWeightsDir === undefined ? {} : { packedWeightsDir })
        })
  if (runner instanceof Runner && runner.packedWeights !== undefined) {
    const { use, copy } = runner.packedWeights
    console.error(
      use === "mapped"
        ? `worker ${rank}: the decoder's packed weights are mapped from ${copy}`
        : use === "saved"
          ? `worker ${rank}: the decoder's packed weights were written to ${copy} for the next load`
          : `worker ${rank}: the decoder's packed weights could not be kept in ${copy}; packed at load`
    )
  }
  /** Requests that joined with a cache another executor sent (a prefill's `kv`), and its positions. */
  const imports = { requests: 0, tokens: 0 }
  /** Steps that prefilled or decoded, and the seconds the runner took for them. */
  const steps = { count: 0, seconds: 0 }
  /** The span of each traced request this worker generates for, with its tokens so far. */
  const generating = new Map<string, { readonly span: Span; tokens: number }>()
  /** Generations that stream their hidden states: each one's next chunk, and its sends so far, in order. */
  const streaming = new Map<string, { readonly states: StatesStream; next: number; sent: Promise<void> }>()

  /**
   * A generated token's partial, its step input's hidden state (if it has one) sent on as the
   * next chunk of its stream, which its last token closes. A chunk that cannot be sent leaves the
   * stream open: its reader's wait for the chunk ends in that reader's time limit.
   */
  const streamStates = (id: string, partial: TokenPartial): TokenPartial => {
    const streamed = streaming.get(id)
    if (streamed === undefined || sidecar === undefined) return partial
    const { hidden, ...rest } = partial
    const { states } = streamed
    if (hidden !== undefined) {
      const chunk = streamed.next++
      streamed.sent = streamed.sent.then(() =>
        sidecar.send(states.id, new Tensor("float32", [1, hidden.length], hidden), {
          to: states.receivers,
          chunk,
          stream: true
        })
      )
    }
    if (partial.finish !== undefined) closeStates(id)
    return rest
  }
  const closeStates = (id: string) => {
    const streamed = streaming.get(id)
    streaming.delete(id)
    if (streamed === undefined || sidecar === undefined) return
    const { states } = streamed
    void streamed.sent
      .then(() => sidecar.closeStream(states.id, { numChunks: streamed.next, to: states.receivers }))
      .catch(() => undefined)
  }

  const transfer = async (op: StepOp): Promise<KvResult | undefined> => {
    if (op.op !== "kv-export" && op.op !== "kv-import") return undefined
    if (!(runner instanceof Runner)) return { error: "this model's executor has no KV cache to move" }
    if (op.op === "kv-import") return checkPrefix(runner.cacheGeometry, op.prompt, op.shape, op.dtype)
    if (sidecar === undefined) return { error: "this executor has no sidecar to send a KV cache through" }
    const exported = await exportPrefix(runner, op.prompt)
    // A chunk a cache tensor (a layer's keys or values), as the decoder gave it (a long prompt's
    // whole cache may be larger than the sidecar's largest slot).
    const dtype = runner.cacheGeometry.half ? "float16" : "float32"
    const [tensors, heads, positions, headDim] = exported.shape
    for (let t = 0; t < tensors; t++)
      await sidecar.send(op.id, new Tensor(dtype, [heads, positions, headDim], exported.tensors[t] as never), {
        to: op.receivers,
        chunk: t,
        numChunks: tensors + 1
      })
    // Then the tokens they are the keys and values of: the receiver checks its prompt starts with them.
    await sidecar.send(op.id, new Tensor("int32", [positions], op.prompt.inputIds.slice(0, positions)), {
      to: op.receivers,
      chunk: tensors,
      numChunks: tensors + 1
    })
    return { shape: exported.shape, dtype, cached: exported.cached }
  }

  /**
   * A prefill's cache sent by another executor (its `kv`), as views of the sidecar's arena that
   * the runner copies once, into the request's cache; the router frees them once the request has
   * joined. Chunks gone meanwhile leave the prompt to be prefilled whole.
   */
  const imported = async (op: StepOp): Promise<PastData | undefined> => {
    if (op.op !== "prefill" || op.kv === undefined || sidecar === undefined || !(runner instanceof Runner))
      return undefined
    const tensors: Array<CacheArray> = []
    for (let t = 0; t < op.kv.shape[0]; t++) {
      const chunk = await sidecar.recv(op.kv.id, t, { timeoutMs: importWaitMs }).catch(() => undefined)
      if (!(chunk instanceof Tensor)) return undefined
      tensors.push(chunk.data as CacheArray)
    }
    const taken = importedPast(runner.cacheGeometry, op.prompt, { tensors, shape: op.kv.shape })
    return "past" in taken ? taken.past : undefined
  }

  return {
    tracesItsItems: true,
    async run({ items, emit }) {
      /** Spans of this step's embed items, from their compute to their send through the sidecar. */
      const embedding = items.map((item) =>
        item.meta.op === "embed" ? startSpan("embed", { parent: item.trace }) : noSpan
      )
      for (const item of items) {
        const op = item.meta
        if (op.op === "prefill" && op.states !== undefined)
          streaming.set(item.requestId, { states: op.states, next: op.states.firstChunk, sent: Promise.resolve() })
        else if (op.op === "free") closeStates(item.requestId)
        if (op.op === "prefill" && item.trace !== undefined) {
          const span = startSpan("generate", {
            parent: item.trace,
            attributes: { "cornserve.prompt_tokens": op.prompt.inputIds.length, "cornserve.worker.rank": rank }
          })
          generating.set(item.requestId, { span, tokens: 0 })
        } else if (op.op === "free") {
          const traced = generating.get(item.requestId)
          generating.delete(item.requestId)
          traced?.span.attribute("cornserve.cancelled", true)
          traced?.span.end()
        }
      }
      // A prompt's KV cache out through the sidecar, or in from another executor (PrefixTransfer.ts).
      const transfers = await Promise.all(items.map((item) => transfer(item.meta)))
      const pasts = await Promise.all(items.map((item) => imported(item.meta)))
      for (const past of pasts)
        if (past !== undefined) {
          imports.requests++
          imports.tokens += past.width
        }
      let outputs: Awaited<ReturnType<StepRunner["step"]>>
      const generates = items.some((item) => item.meta.op === "prefill" || item.meta.op === "decode")
      const started = performance.now()
      try {
        outputs = await runner.step(
          items.map((item, index) => ({
            id: item.requestId,
            op: item.meta,
            ...(pasts[index] === undefined ? {} : { imported: pasts[index] })
          })),
          (index, value) => {
            const id = items[index]!.requestId
            const traced = generating.get(id)
            if (traced !== undefined) {
              traced.tokens++
              const finish = value.finish
              if (finish !== undefined) {
                traced.span.attribute("cornserve.completion_tokens", traced.tokens)
                traced.span.attribute("cornserve.finish_reason", finish)
                traced.span.end()
                generating.delete(id)
              }
            }
            emit(index, streamStates(id, value))
          }
        )
      } catch (error) {
        for (const item of items) {
          generating.get(item.requestId)?.span.end(error)
          generating.delete(item.requestId)
        }
        for (const span of embedding) span.end(error)
        throw error
      }
      if (generates) {
        steps.count++
        steps.seconds += (performance.now() - started) / 1000
      }
      return Promise.all(
        items.map(async (item, index): Promise<EmbedResult | KvResult | WorkerStats | undefined> => {
          if (transfers[index] !== undefined) return transfers[index]
          const output = outputs[index]
          const op = item.meta
          if (output !== undefined && "prefixCache" in output)
            return {
              ...(output.prefixCache === undefined ? {} : { prefixCache: output.prefixCache }),
              ...(output.kvCache === undefined ? {} : { kvCache: output.kvCache }),
              kvImports: { ...imports },
              ...(output.decoderRuns === undefined
                ? {}
                : {
                    steps: {
                      ...steps,
                      decoderRuns: output.decoderRuns.runs,
                      decoderSeconds: output.decoderRuns.seconds
                    }
                  })
            }
          if (output === undefined || op.op !== "embed") return undefined
          const span = embedding[index]!
          try {
            if ("error" in output) return { error: output.error }
            if (op.inline) return { shape: output.shape, embedding: output.embedding }
            if (sidecar === undefined) return { error: 'this executor has no sidecar; ask for return: "inline"' }
            await sidecar.send(op.id, new Tensor("float32", output.shape, output.embedding), {
              to: op.receivers,
              ...(op.stream === true ? { stream: true } : {}),
              ...(span.traceparent === undefined ? {} : { traceparent: span.traceparent })
            })
            return { shape: output.shape }
          } catch (error) {
            span.end(error)
            throw error
          } finally {
            span.end()
          }
        })
      )
    },
    async close() {
      await runner.close()
      await sidecar?.close()
    }
  }
}
