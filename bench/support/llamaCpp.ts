/**
 * llama.cpp through node-llama-cpp (its prebuilt CPU binary, nothing built or downloaded), on a
 * GGUF file of the bench's weights: greedy generations from token ids, one sequence or several in
 * parallel (which llama.cpp decodes as one batch), timed as the benches time the executor.
 */
import { getLlama, type Llama, type LlamaContext, type LlamaModel, type Token } from "node-llama-cpp"

export interface LlamaRun {
  readonly tokens: ReadonlyArray<number>
  readonly firstTokenMs: number
  readonly decodeMs: number
  readonly endMs: number
}

export class LlamaCpp {
  private constructor(
    private readonly llama: Llama,
    private readonly model: LlamaModel,
    private readonly context: LlamaContext,
    readonly sequences: number
  ) {}

  /** Loads `path` with a context of `sequences` sequences of `positions` each, on `threads` threads. */
  static async open(
    path: string,
    options: { readonly threads: number; readonly sequences: number; readonly positions: number }
  ) {
    const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" as never })
    const model = await llama.loadModel({ modelPath: path })
    const context = await model.createContext({
      contextSize: options.sequences * options.positions,
      sequences: options.sequences,
      threads: options.threads,
      batchSize: 512
    })
    return new LlamaCpp(llama, model, context, options.sequences)
  }

  /** Greedy completions of each prompt, all at once (at most `sequences`), `tokens` tokens each; times from `origin`. */
  async generate(
    prompts: ReadonlyArray<ReadonlyArray<number>>,
    tokens: number,
    origin = performance.now()
  ): Promise<Array<LlamaRun>> {
    const sequences = prompts.map(() => this.context.getSequence())
    try {
      return await Promise.all(
        prompts.map(async (prompt, index) => {
          const generated: Array<number> = []
          let first = 0
          let last = 0
          for await (const token of sequences[index]!.evaluate([...prompt] as Array<Token>, { temperature: 0 })) {
            last = performance.now()
            if (generated.length === 0) first = last
            generated.push(token)
            if (generated.length >= tokens) break
          }
          return { tokens: generated, firstTokenMs: first - origin, decodeMs: last - first, endMs: last - origin }
        })
      )
    } finally {
      for (const sequence of sequences) sequence.dispose()
    }
  }

  async close(): Promise<void> {
    await this.context.dispose()
    await this.model.dispose()
    await this.llama.dispose()
  }
}
