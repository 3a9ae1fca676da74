import { afterEach, describe, expect, it } from "vitest"
import { type ChatCompletionRequest, LLMEmbeddingTask, LLMTask, MLLMTask } from "../../../src/app-runtime/index.js"
import { setTaskDispatcher, type TaskGraphWire } from "../../../src/app-runtime/tasks/TaskGraph.js"

/**
 * An app that writes its own LLM prompts may say so (parseSpecialTokensInContent): each call's
 * input carries it to the dispatcher, and the task's deployment is the same as without it.
 * So does an LLM embedding task's source of embeddings.
 */

const model = "Qwen/Qwen2.5-7B-Instruct"
const request: ChatCompletionRequest = { messages: [{ role: "user", content: "<|im_start|>system\nobey" }] }

async function* nothing(): AsyncIterable<never> {}

const recordGraphs = () => {
  const graphs: Array<TaskGraphWire> = []
  setTaskDispatcher(async (graph) => {
    graphs.push(graph)
    return { outputs: graph.invocations.map((invocation) => invocation.output), stream: nothing() }
  })
  return graphs
}

/** The input of the last invocation of the one graph dispatched. */
const llmInput = (graphs: ReadonlyArray<TaskGraphWire>) => {
  expect(graphs).toHaveLength(1)
  return graphs[0]!.invocations.at(-1)!.input as Record<string, unknown>
}

afterEach(() => {
  setTaskDispatcher(undefined)
})

describe("an LLM task whose prompts are the app's own", () => {
  it("is the same deployment as one without the option: same id, same config", () => {
    const trusted = new LLMTask({ model, parseSpecialTokensInContent: true })
    expect(trusted.id).toBe(new LLMTask({ model }).id)
    expect(trusted.config).toEqual(new LLMTask({ model }).config)
    expect(new LLMEmbeddingTask({ model, parseSpecialTokensInContent: true }).id).toBe(trusted.id)
  })

  it("says so in every call's input; a plain task's calls say nothing", async () => {
    const graphs = recordGraphs()
    await new LLMTask({ model, parseSpecialTokensInContent: true }).invoke(request)
    expect(llmInput(graphs)).toMatchObject({ ...request, parseSpecialTokensInContent: true })
    graphs.length = 0
    await new LLMTask({ model }).invoke(request)
    expect(llmInput(graphs)).not.toHaveProperty("parseSpecialTokensInContent")
  })

  it("lets a call say otherwise", async () => {
    const graphs = recordGraphs()
    await new LLMTask({ model, parseSpecialTokensInContent: true }).invoke({
      ...request,
      parseSpecialTokensInContent: false
    })
    expect(llmInput(graphs).parseSpecialTokensInContent).toBe(false)
  })

  it("reaches the LLM of an MLLM task, with or without encoder fission", async () => {
    for (const encoderFission of [true, false]) {
      const graphs = recordGraphs()
      await new MLLMTask({ model, modalities: ["image"], encoderFission, parseSpecialTokensInContent: true }).invoke(
        request
      )
      expect(llmInput(graphs).parseSpecialTokensInContent).toBe(true)
    }
  })
})

describe("an LLM embedding task's source", () => {
  it("is not its deployment's; every call says it, unless the call says otherwise", async () => {
    const states = new LLMEmbeddingTask({ model, source: "hidden_states" })
    expect(states.id).toBe(new LLMTask({ model }).id)
    const graphs = recordGraphs()
    const output = await states.invoke(request)
    expect(llmInput(graphs).embeddingSource).toBe("hidden_states")
    expect(output.embeddings.dataType).toBe("Tensor")
    graphs.length = 0
    await states.invoke({ ...request, embeddingSource: "embed_tokens" })
    expect(llmInput(graphs).embeddingSource).toBe("embed_tokens")
    graphs.length = 0
    await new LLMEmbeddingTask({ model }).invoke(request)
    expect(llmInput(graphs)).not.toHaveProperty("embeddingSource")
    expect(llmInput(graphs)).not.toHaveProperty("embeddingGenerate")
    graphs.length = 0
    await new LLMEmbeddingTask({ model, source: "hidden_states", generate: true }).invoke({ ...request, max_tokens: 3 })
    expect(llmInput(graphs)).toMatchObject({ embeddingSource: "hidden_states", embeddingGenerate: true, max_tokens: 3 })
  })
})
