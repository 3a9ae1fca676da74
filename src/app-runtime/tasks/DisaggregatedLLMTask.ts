import * as Schema from "effect/Schema"
import type { ChatCompletionChunk } from "../schemas/OpenAI.js"
import { DataForward } from "./DataForward.js"
import { LLMConfig, LLMInput } from "./LLMTask.js"
import { CompositeTask, modelShortName, UnitTask } from "./Task.js"
import { TaskStream } from "./TaskStream.js"

/**
 * An LLM with its prefill and its decode on executors apart, as vLLM and NVIDIA Dynamo serve: a
 * long prompt is prefilled on the prefill task's executors and never stalls the streams the decode
 * task's executors run; the two scale apart. The prompt's KV cache goes from one to the other
 * through the sidecar (the LLM executor's `/v1/cornserve/kv-prefill` and `cornserve_kv`), and the
 * decode executor prefills only the prompt's last part, after the cache's whole blocks. Each half
 * is a deployment of its own, shared by every app that uses the same config, like any task.
 */

/** The config of either half: an LLMTask's, less the phase, which each half sets. */
export type DisaggregatedLLMConfig = Omit<LLMConfig, "phase">

export interface PrefillLLMOutput {
  /** The prompt's KV cache, held in the sidecar for the decode task's executor. */
  readonly kv: DataForward<"Tensor">
  /**
   * The media embeddings the prompt took (its input's `cornserveEmbeddings`), sent on by the
   * prefill executor, in order: the decode executor builds the same prompt from them.
   */
  readonly embeddings: ReadonlyArray<DataForward<"Tensor">>
}

/** A half of a DisaggregatedLLMTask: an LLM deployment of its own, named by its phase. */
abstract class LLMPhaseTask<I, O> extends UnitTask<I, O, typeof LLMConfig.Type> {
  readonly name: string

  constructor(config: DisaggregatedLLMConfig, phase: "prefill" | "decode") {
    super("llm", LLMConfig, { ...config, phase })
    this.name = `llm-${phase}-${modelShortName(this.config.model)}`
  }
}

/** Prefills a chat's prompt and forwards its KV cache (the first half of a DisaggregatedLLMTask). */
export class PrefillLLMTask extends LLMPhaseTask<LLMInput, PrefillLLMOutput> {
  readonly operation = "kv-prefill"
  protected readonly inputSchema = LLMInput

  constructor(config: DisaggregatedLLMConfig) {
    super(config, "prefill")
  }

  protected makeRecordOutput(input: LLMInput): PrefillLLMOutput {
    return {
      kv: new DataForward("Tensor"),
      embeddings: (input.cornserveEmbeddings ?? []).map(() => new DataForward("Tensor"))
    }
  }
}

/** A chat request, and the KV cache of its prompt that a PrefillLLMTask forwarded. */
export const DecodeLLMInput = Schema.extend(
  LLMInput,
  Schema.Struct({ cornserveKv: Schema.optional(Schema.instanceOf(DataForward)) })
)
export type DecodeLLMInput = typeof DecodeLLMInput.Type

/** Streams a chat's answer from its prompt's forwarded KV cache (the second half of a DisaggregatedLLMTask). */
export class DecodeLLMTask extends LLMPhaseTask<DecodeLLMInput, TaskStream<ChatCompletionChunk>> {
  readonly operation = "chat"
  protected readonly inputSchema = DecodeLLMInput

  constructor(config: DisaggregatedLLMConfig) {
    super(config, "decode")
  }

  protected makeRecordOutput(): TaskStream<ChatCompletionChunk> {
    return TaskStream.placeholder()
  }
}

/** An LLM task whose prefill and decode run on executors apart; an app uses it as an LLMTask. */
export class DisaggregatedLLMTask extends CompositeTask<LLMInput, TaskStream<ChatCompletionChunk>> {
  readonly name: string
  readonly prefill: PrefillLLMTask
  readonly decode: DecodeLLMTask

  constructor(config: DisaggregatedLLMConfig) {
    super()
    this.prefill = this.use(new PrefillLLMTask(config))
    this.decode = this.use(new DecodeLLMTask(config))
    this.name = `llm-disaggregated-${modelShortName(this.prefill.config.model)}`
  }

  compose(input: LLMInput): TaskStream<ChatCompletionChunk> {
    const { kv, embeddings } = this.prefill.compose(input)
    return this.decode.compose({
      ...input,
      ...(input.cornserveEmbeddings === undefined ? {} : { cornserveEmbeddings: embeddings }),
      cornserveKv: kv
    })
  }
}
