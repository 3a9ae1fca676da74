/**
 * The model side of the LLM executor for a talker (model_type "cornserve_talker",
 * architectures/Talker.ts): each request's codec frames, from the thinker's hidden states it is
 * given as its prompt.
 *
 * A prefill projects the hidden states (thinker_projection) and runs the decoder over them; each
 * step then chooses a frame: the first code from the decoder's last logits (the Sampler: greedy
 * at temperature 0, else a draw seeded by the request; the begin-of-speech code never), then the
 * frame's other codes from the depth head (code_predictor, greedy), and the frame, embedded
 * (codec_embed), is the decoder's next input. The end-of-speech code ends the request ("stop"), as
 * does its frame limit ("length"). A frame leaves as a partial whose `frame` holds its codes.
 *
 * A request whose thinker streams its answer (TalkRequest's `trailing`) adds the thinker's rows
 * to its frames' inputs as they come, row k projected into frame k + 1's (Qwen3-Omni's talker
 * reads its thinker this way); a frame whose row has not come yet waits for it, or for the
 * thinker's end, after which the frames go on from their codes alone. A step in which every
 * request waits sleeps until a row comes (or a short while), so that waiting does not spin.
 *
 * Each request runs as its own batch of one row, its past kept as the decoder gave it: a
 * request's frames are the same whatever runs beside it, at the cost of a decoder run per
 * request a step.
 */
import * as ort from "onnxruntime-node"
import type { ModelDirectory } from "../../models/ModelDirectory.js"
import { talkerGraphPaths, type TalkerSpec, talkerSpec } from "../../models/TalkerModel.js"
import { setTimeout as sleep } from "node:timers/promises"
import type { SidecarClient } from "../../sidecar/SidecarClient.js"
import { createSession } from "../common/Sessions.js"
import type { PromptInput, SamplingParams, TokenPartial, TrailingStates } from "./protocol.js"
import { Sampler } from "./Sampler.js"
import type { EmbedOutput, StepItem, StepRunner } from "./StepRunner.js"
import { float, int64 } from "./Tensors.js"
import { TrailingRows } from "./TrailingRows.js"

/** How long a step in which every request waits for its thinker's next row sleeps at most. */
const rowWaitMs = 100

interface Talk {
  readonly sampler: Sampler
  readonly maxFrames: number
  frames: number
  lastFrame: BigInt64Array
  /** Positions in its cache. */
  width: number
  past: ReadonlyArray<ort.Tensor>
  /** The thinker's rows after its prompt, as they stream in. */
  readonly trailing?: TrailingRows
}

/** A step's answer for one request: its frame, or the end of speech. */
type Chosen = { readonly frame: ReadonlyArray<number> } | { readonly end: number }

export class TalkerRunner implements StepRunner {
  private readonly talks = new Map<string, Talk>()
  /** The decoder's past inputs and the outputs that become them, in the same order. */
  private readonly cache: ReadonlyArray<{ readonly input: string; readonly output: string }>

  private constructor(
    readonly spec: TalkerSpec,
    private readonly projection: ort.InferenceSession,
    private readonly decoder: ort.InferenceSession,
    private readonly predictor: ort.InferenceSession,
    private readonly embed: ort.InferenceSession,
    /** Where trailing rows are read from, and how long each may take to come. */
    private readonly sidecar: SidecarClient | undefined,
    private readonly rowWaitLimitMs: number
  ) {
    this.cache = decoder.inputNames
      .filter((name) => name.startsWith("past_key_values."))
      .map((input) => ({ input, output: `present.${input.slice("past_key_values.".length)}` }))
    if (this.cache.length !== 2 * spec.layers)
      throw new Error(
        `the talker's decoder takes ${this.cache.length} past tensors; its ${spec.layers} layers need ${2 * spec.layers}`
      )
  }

  static async open(
    model: ModelDirectory,
    device: string,
    threads: number,
    sidecar?: SidecarClient,
    rowWaitLimitMs = 30_000
  ): Promise<TalkerRunner> {
    const spec = talkerSpec(model)
    const paths = talkerGraphPaths(model)
    const [projection, decoder, predictor, embed] = await Promise.all([
      createSession(paths.projection, device, threads),
      createSession(paths.decoder, device, threads, { spin: true }),
      createSession(paths.predictor, device, threads),
      createSession(paths.embed, device, threads)
    ])
    return new TalkerRunner(spec, projection, decoder, predictor, embed, sidecar, rowWaitLimitMs)
  }

  get held(): ReadonlyArray<string> {
    return [...this.talks.keys()]
  }

  /**
   * Runs one step: frees, then each joining request's prefill and first frame, then one frame for
   * every request that goes on. Embed items are refused: a talker writes frames, not embeddings.
   */
  async step(
    items: ReadonlyArray<StepItem>,
    emit: (index: number, partial: TokenPartial) => void
  ): Promise<Array<EmbedOutput | undefined>> {
    const outputs: Array<EmbedOutput | undefined> = items.map(() => undefined)
    for (const item of items) if (item.op.op === "free") this.forget(item.id)
    let ran = false
    const waiting: Array<TrailingRows> = []
    for (const [index, item] of items.entries()) {
      if (item.op.op === "embed") outputs[index] = { error: "a talker writes codec frames, not prompt embeddings" }
      else if (item.op.op === "prefill") {
        const chosen = await this.prefill(item.id, item.op.prompt, item.op.sampling, item.op.trailing)
        this.accept(item.id, chosen, (partial) => emit(index, partial))
        ran = true
      } else if (item.op.op === "decode") {
        const talk = this.talks.get(item.id)
        if (talk === undefined) continue
        // Frame k reads the thinker's row k - 1, when it streams its answer.
        const row = talk.trailing?.row(talk.frames - 1)
        if (row === "waiting") {
          waiting.push(talk.trailing!)
          continue
        }
        this.accept(item.id, await this.next(talk, row), (partial) => emit(index, partial))
        ran = true
      }
    }
    if (!ran && waiting.length > 0) await Promise.race([...waiting.map((rows) => rows.changed), sleep(rowWaitMs)])
    return outputs
  }

  async close(): Promise<void> {
    for (const id of [...this.talks.keys()]) this.forget(id)
    await Promise.all([this.projection, this.decoder, this.predictor, this.embed].map((session) => session.release()))
  }

  private forget(id: string): void {
    this.talks.get(id)?.trailing?.stop()
    this.talks.delete(id)
  }

  private async prefill(
    id: string,
    prompt: PromptInput,
    sampling: SamplingParams,
    trailing: TrailingStates | undefined
  ): Promise<Chosen> {
    const media = prompt.media[0]
    const rows = prompt.inputIds.length
    if (prompt.media.length !== 1 || media?.input.kind !== "embedding" || media.start !== 0 || media.rows !== rows)
      throw new Error("a talker's prompt is one embedding over all its positions: the thinker's hidden states")
    if (trailing !== undefined && this.sidecar === undefined)
      throw new Error("a talker reads trailing hidden states from its sidecar: this worker has none")
    const { inputs_embeds } = await this.projection.run({
      thinker_hidden_states: float(media.input.data, [1, rows, this.spec.thinkerHiddenSize])
    })
    const empty = new ort.Tensor("float32", new Float32Array(0), [1, this.spec.kvHeads, 0, this.spec.headDim])
    const talk: Talk = {
      sampler: new Sampler({ temperature: sampling.temperature, topP: sampling.topP, topK: 0, seed: sampling.seed }),
      maxFrames: sampling.maxNewTokens,
      frames: 0,
      lastFrame: new BigInt64Array(this.spec.codebooks),
      width: 0,
      past: this.cache.map(() => empty),
      ...(trailing === undefined
        ? {}
        : {
            trailing: new TrailingRows(
              this.sidecar!,
              trailing.id,
              trailing.firstChunk,
              this.spec.thinkerHiddenSize,
              this.rowWaitLimitMs
            )
          })
    }
    this.talks.set(id, talk)
    return this.forward(talk, inputs_embeds!, rows)
  }

  /** The next frame, from the last one's codes, embedded, and the thinker's row for it (projected) added. */
  private async next(talk: Talk, row: Float32Array | undefined): Promise<Chosen> {
    const { inputs_embeds } = await this.embed.run({ codes: int64(talk.lastFrame, [1, 1, this.spec.codebooks]) })
    if (row !== undefined) {
      const projected = await this.projection.run({ thinker_hidden_states: float(row, [1, 1, row.length]) })
      const sum = inputs_embeds!.data as Float32Array
      const add = projected.inputs_embeds!.data as Float32Array
      for (let i = 0; i < sum.length; i++) sum[i]! += add[i]!
    }
    return this.forward(talk, inputs_embeds!, 1)
  }

  /** The decoder over `fresh` new positions, then the frame chosen from the last. */
  private async forward(talk: Talk, embeds: ort.Tensor, fresh: number): Promise<Chosen> {
    const width = talk.width + fresh
    const feeds: Record<string, ort.Tensor> = {
      inputs_embeds: embeds,
      attention_mask: int64(new BigInt64Array(width).fill(1n), [1, width]),
      position_ids: int64(
        BigInt64Array.from({ length: fresh }, (_, i) => BigInt(talk.width + i)),
        [1, fresh]
      )
    }
    this.cache.forEach((names, i) => (feeds[names.input] = talk.past[i]!))
    const outputs = await this.decoder.run(feeds)
    talk.past = this.cache.map((names) => outputs[names.output]!)
    talk.width = width
    const vocabulary = this.spec.codebookSize + 2
    const logits = (outputs.logits!.data as Float32Array).slice((fresh - 1) * vocabulary, fresh * vocabulary)
    logits[this.spec.beginCode] = -Infinity
    const first = talk.sampler.next(logits, 0, vocabulary)
    if (first === this.spec.endCode) return { end: first }
    const hidden = this.spec.hiddenSize
    const state = (outputs.last_hidden_state!.data as Float32Array).slice((fresh - 1) * hidden, fresh * hidden)
    const { codes } = await this.predictor.run({
      last_hidden_state: float(state, [1, hidden]),
      first_code: int64(BigInt64Array.of(BigInt(first)), [1])
    })
    const frame = [first, ...Array.from(codes!.data as BigInt64Array, Number)]
    talk.lastFrame = BigInt64Array.from(frame, BigInt)
    return { frame }
  }

  private accept(id: string, chosen: Chosen, take: (partial: TokenPartial) => void) {
    const talk = this.talks.get(id)!
    if ("end" in chosen) {
      this.forget(id)
      return take({ token: chosen.end, finish: "stop" })
    }
    talk.frames++
    const done = talk.frames >= talk.maxFrames
    if (done) this.forget(id)
    take({ token: chosen.frame[0]!, frame: chosen.frame, ...(done ? { finish: "length" as const } : {}) })
  }
}
