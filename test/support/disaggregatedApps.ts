import { expect } from "vitest"

/** An app that streams a chat through `task` (an LLMTask or a DisaggregatedLLMTask) on `model`. */
export const disaggregatedAppSource = (model: string, task: "LLMTask" | "DisaggregatedLLMTask") => `
import { ChatCompletionRequest, defineApp, ${task} } from "cornserve/app"
const llm = new ${task}({ model: ${JSON.stringify(model)} })
export default defineApp({
  tasks: { llm },
  request: ChatCompletionRequest,
  serve: (request) => llm.invoke(request as never)
})
`

/** An app that streams a chat with media through `task` on `model`, its encoders tasks of their own. */
export const disaggregatedMllmAppSource = (
  model: string,
  task: "MLLMTask" | "DisaggregatedMLLMTask",
  modalities: ReadonlyArray<string> = ["image"]
) => `
import { ChatCompletionRequest, defineApp, ${task} } from "cornserve/app"
const mllm = new ${task}({ model: ${JSON.stringify(model)}, modalities: ${JSON.stringify(modalities)}, encoderFission: true })
export default defineApp({ tasks: { mllm }, request: ChatCompletionRequest, serve: (request) => mllm.invoke(request) })
`

/** The text of an app's streamed answer (NDJSON chunks); a failed stream throws. */
export const streamedText = async (response: Response): Promise<string> => {
  const body = await response.text()
  expect(response.status, body).toBe(200)
  return body
    .split("\n")
    .filter((line) => line.trim().length > 0)
    .map((line) => JSON.parse(line) as { error?: unknown; choices?: Array<{ delta: { content?: string } }> })
    .map((chunk) => {
      if (chunk.error !== undefined) throw new Error(`the stream failed: ${JSON.stringify(chunk.error)}`)
      return chunk.choices?.[0]?.delta.content ?? ""
    })
    .join("")
}
