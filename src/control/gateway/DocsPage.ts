/**
 * `/docs` and `/app/:id/docs`: Swagger UI (the `swagger-ui-dist` package, served from this
 * installation, so that the page works with no network) showing an OpenAPI document of the gateway.
 * The page loads nothing from anywhere else: its Content-Security-Policy lets it reach only the
 * gateway, whatever an app's description or schemas hold.
 */
import { readFileSync } from "node:fs"
import { createRequire } from "node:module"
import { dirname, join } from "node:path"

const distDir = dirname(createRequire(import.meta.url).resolve("swagger-ui-dist/package.json"))

/**
 * Starts Swagger UI on the page's element with the document its `data-url` names; no validator
 * badge (it would call swagger.io). An app with API keys answers its document only to a caller
 * with a key: then the page asks for one, fetches the document with it, and sends it with every
 * request tried from the page. The key is kept for the browser tab's session only.
 */
const initializer = `const root = document.getElementById("swagger-ui")
const keyName = "cornserve-api-key"
const start = (spec, key) => {
  root.replaceChildren()
  window.ui = SwaggerUIBundle({
    spec,
    domNode: root,
    deepLinking: true,
    validatorUrl: null,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
    requestInterceptor: (request) => {
      if (key) request.headers.Authorization = "Bearer " + key
      return request
    }
  })
}
const askForKey = (problem) => {
  const box = document.createElement("div")
  box.className = "cornserve-key"
  box.style.cssText = "font-family: sans-serif; max-width: 40em; margin: 3em auto"
  const text = document.createElement("p")
  text.textContent = problem
  const input = document.createElement("input")
  input.type = "password"
  input.placeholder = "API key"
  input.autocomplete = "off"
  input.style.cssText = "width: 28em; padding: 0.4em"
  const button = document.createElement("button")
  button.textContent = "Show"
  button.style.cssText = "margin-left: 0.5em; padding: 0.4em 1em"
  const go = () => load(input.value.trim())
  button.addEventListener("click", go)
  input.addEventListener("keydown", (event) => { if (event.key === "Enter") go() })
  box.append(text, input, button)
  root.replaceChildren(box)
  input.focus()
}
const load = async (key) => {
  const headers = key ? { Authorization: "Bearer " + key } : {}
  let response
  try {
    response = await fetch(root.dataset.url, { headers })
  } catch (error) {
    root.textContent = "The document could not be fetched: " + error
    return
  }
  if (response.status === 401) {
    sessionStorage.removeItem(keyName)
    askForKey(key ? "That key is not accepted. This app's document needs an API key:" : "This app's document needs an API key:")
    return
  }
  if (!response.ok) {
    root.textContent = "The document could not be fetched: HTTP " + response.status
    return
  }
  if (key) sessionStorage.setItem(keyName, key)
  start(await response.json(), key)
}
load(sessionStorage.getItem(keyName) || "")
`

/** The files under `/docs/`: the package's, by name, and the initializer. */
const assetTypes: ReadonlyMap<string, string> = new Map([
  ["swagger-ui.css", "text/css; charset=utf-8"],
  ["index.css", "text/css; charset=utf-8"],
  ["swagger-ui-bundle.js", "text/javascript; charset=utf-8"],
  ["favicon-32x32.png", "image/png"],
  ["favicon-16x16.png", "image/png"],
  ["cornserve-docs.js", "text/javascript; charset=utf-8"]
])

export interface DocsAsset {
  readonly body: Uint8Array
  readonly contentType: string
}

/** Read once, when first asked for: the bundle is over a megabyte, and most platforms never serve it. */
const assets = new Map<string, DocsAsset>()

/** A file of the page (`/docs/NAME`), or undefined when there is none by that name. */
export const docsAsset = (name: string): DocsAsset | undefined => {
  const contentType = assetTypes.get(name)
  if (contentType === undefined) return undefined
  let asset = assets.get(name)
  if (asset === undefined) {
    const body = name === "cornserve-docs.js" ? Buffer.from(initializer) : readFileSync(join(distDir, name))
    asset = { body, contentType }
    assets.set(name, asset)
  }
  return asset
}

/** What the page and its files may load: the gateway's own, and the images Swagger UI inlines. */
export const docsContentSecurityPolicy =
  "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

const escapedAttribute = (text: string) =>
  text.replace(/&/g, "&amp;").replace(/"/g, "&quot;").replace(/</g, "&lt;").replace(/>/g, "&gt;")

/** The page showing the document at `documentPath` (a path of the gateway), titled `title`. */
export const docsPage = (title: string, documentPath: string): string => `<!DOCTYPE html>
<html lang="en">
  <head>
    <meta charset="utf-8">
    <title>${escapedAttribute(title)}</title>
    <link rel="stylesheet" href="/docs/swagger-ui.css">
    <link rel="stylesheet" href="/docs/index.css">
    <link rel="icon" type="image/png" href="/docs/favicon-32x32.png" sizes="32x32">
    <link rel="icon" type="image/png" href="/docs/favicon-16x16.png" sizes="16x16">
  </head>
  <body>
    <div id="swagger-ui" data-url="${escapedAttribute(documentPath)}"></div>
    <script src="/docs/swagger-ui-bundle.js"></script>
    <script src="/docs/cornserve-docs.js"></script>
  </body>
</html>
`
