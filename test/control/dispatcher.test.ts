import { afterEach, describe, expect, it } from "vitest"
import { type ChatCompletionRequest, MLLMTask } from "../../src/app-runtime/index.js"
import {
  setTaskDispatcher,
  type TaskGraphWire,
  type TaskInvocationWire
} from "../../src/app-runtime/tasks/TaskGraph.js"
import { wireDataForwards } from "../../src/control/dispatcher/Dispatcher.js"

/** A forwarded datum as it appears in a wire graph. */
const forward = (id: string) => ({ $dataForward: id, dataType: "Tensor" })

const encoderCall = (taskId: string, produces: ReadonlyArray<string>): TaskInvocationWire => ({
  taskId,
  kind: "encoder",
  operation: "embed",
  config: { model: "m", modality: "image", maxBatchSize: 1 },
  input: { urls: produces.map((id) => `https://example.com/${id}.png`) },
  output: { embeddings: produces.map(forward) },
  streams: false
})

const llmCall = (taskId: string, consumes: ReadonlyArray<string>): TaskInvocationWire => ({
  taskId,
  kind: "llm",
  operation: "chat",
  config: { model: "m", receiveEmbeddings: true },
  input: { messages: [{ role: "user", content: "hi" }], cornserveEmbeddings: consumes.map(forward) },
  output: {},
  streams: true
})

const graphOf = (first: TaskInvocationWire, ...rest: Array<TaskInvocationWire>): TaskGraphWire => ({
  invocations: [first, ...rest]
})

describe("wireDataForwards", () => {
  it("wires each produced datum from its producer to its consumers", () => {
    const graph = graphOf(encoderCall("encoder-a", ["img1"]), llmCall("llm-b", ["img1"]))

    expect(wireDataForwards(graph)).toEqual([{ id: "img1", producer: 0, consumers: [1] }])
  })

  it("wires several data, including one datum consumed by several tasks", () => {
    const graph = graphOf(
      encoderCall("encoder-image", ["img1", "img2"]),
      encoderCall("encoder-audio", ["aud1"]),
      llmCall("llm-first", ["img1", "aud1"]),
      llmCall("llm-second", ["img2", "img1"])
    )

    const wiring = wireDataForwards(graph)

    expect(wiring).toEqual(
      expect.arrayContaining([
        { id: "img1", producer: 0, consumers: [2, 3] },
        { id: "img2", producer: 0, consumers: [3] },
        { id: "aud1", producer: 1, consumers: [2] }
      ])
    )
    expect(wiring).toHaveLength(3)
  })

  it("answers an empty wiring for a graph that forwards nothing", () => {
    expect(wireDataForwards(graphOf(llmCall("llm-only", [])))).toEqual([])
  })

  it("refuses a consumer of data that no task produced, naming the task and the datum", () => {
    const graph = graphOf(encoderCall("encoder-a", ["img1"]), llmCall("llm-b", ["img1", "ghost"]))

    const wiring = wireDataForwards(graph)

    expect(typeof wiring).toBe("string")
    expect(wiring).toContain("llm-b")
    expect(wiring).toContain("ghost")
  })

  it("refuses a consumer placed before the producer of its data", () => {
    const graph = graphOf(llmCall("llm-b", ["img1"]), encoderCall("encoder-a", ["img1"]))

    const wiring = wireDataForwards(graph)

    expect(typeof wiring).toBe("string")
    expect(wiring).toContain("llm-b")
    expect(wiring).toContain("img1")
  })

  it("refuses produced data that nothing consumes, naming the producer and the datum", () => {
    const graph = graphOf(encoderCall("encoder-a", ["img1", "orphan"]), llmCall("llm-b", ["img1"]))

    const wiring = wireDataForwards(graph)

    expect(typeof wiring).toBe("string")
    expect(wiring).toContain("encoder-a")
    expect(wiring).toContain("orphan")
  })

  describe("on a graph recorded by an MLLM invoke", () => {
    afterEach(() => {
      setTaskDispatcher(undefined)
    })

    it("wires each encoder's embedding to the LLM", async () => {
      const graphs: Array<TaskGraphWire> = []
      setTaskDispatcher(async (graph) => {
        graphs.push(graph)
        return { outputs: graph.invocations.map((invocation) => invocation.output) }
      })
      const mllm = new MLLMTask({ model: "Qwen/Qwen2.5-Omni-7B", modalities: ["image", "audio"] })
      const request: ChatCompletionRequest = {
        messages: [
          {
            role: "user",
            content: [
              { type: "image_url", image_url: { url: "https://example.com/cat.png" } },
              { type: "audio_url", audio_url: { url: "https://example.com/meow.wav" } }
            ]
          }
        ]
      }

      await mllm.invoke(request)

      const wiring = wireDataForwards(graphs[0]!)
      expect(typeof wiring).not.toBe("string")
      expect(wiring).toEqual([
        { id: expect.any(String), producer: 0, consumers: [2] },
        { id: expect.any(String), producer: 1, consumers: [2] }
      ])
    })
  })
})
