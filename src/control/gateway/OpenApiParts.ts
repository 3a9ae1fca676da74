/**
 * What the OpenAPI documents' operations share: the prefix of their schemas' names, an error's
 * answer, the API-key requirement, an app's tag.
 */
export const schemasPrefix = "#/components/schemas/"

export const ref = (name: string) => ({ $ref: `${schemasPrefix}${name}` })

const errorContent = { "application/json": { schema: ref("ErrorAnswer") } }
const retryAfter = {
  "Retry-After": { description: "Seconds to wait before trying again.", schema: { type: "integer" } }
}
export const failure = (description: string, retry = false) => ({
  description,
  content: errorContent,
  ...(retry ? { headers: retryAfter } : {})
})

export const apiKeySecurity = (needsApiKey: boolean) => (needsApiKey ? { security: [{ apiKey: [] }] } : {})

export const appTag = (id: string) => `app ${id}`
