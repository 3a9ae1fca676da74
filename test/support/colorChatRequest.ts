/**
 * color_chat's request and answer as a client sees them, free of any test framework, so that
 * benches use them too.
 */

/** A one-pixel red PNG in a chat request for color_chat. */
const redPixel =
  "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
export const chatRequest = JSON.stringify({
  messages: [
    {
      role: "user",
      content: [
        { type: "text", text: "What colour is this?" },
        { type: "image_url", image_url: { url: redPixel } }
      ]
    }
  ],
  max_tokens: 8
})

/** The text of an NDJSON stream of chat-completion chunks. */
export const streamedText = async (response: Response) =>
  (await response.text())
    .trim()
    .split("\n")
    .map((line) => JSON.parse(line) as { choices: Array<{ delta: { content?: string } }> })
    .map((chunk) => chunk.choices[0]?.delta.content ?? "")
    .join("")

/** What the client got: the whole answer, a non-200 status before any of it, or a stream cut after it began. */
export type Outcome =
  | { readonly text: string }
  | { readonly status: number; readonly error: string }
  | { readonly cut: string }

export const outcomeOf = async (response: Response): Promise<Outcome> => {
  if (response.status !== 200) return { status: response.status, error: await response.text() }
  let text = ""
  for (const line of (await response.text()).trim().split("\n")) {
    const chunk = JSON.parse(line) as { error?: unknown; choices?: Array<{ delta: { content?: string } }> }
    if (chunk.error !== undefined) return { cut: text }
    text += chunk.choices?.[0]?.delta.content ?? ""
  }
  return { text }
}
