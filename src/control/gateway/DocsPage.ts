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

/** Starts Swagger UI on the page's element, with the document its `data-url` names; no validator badge (it would call swagger.io). */
const initializer = `const root = document.getElementById("swagger-ui")
window.ui = SwaggerUIBundle({
  url: root.dataset.url,
  domNode: root,
  deepLinking: true,
  validatorUrl: null,
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout"
})
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
