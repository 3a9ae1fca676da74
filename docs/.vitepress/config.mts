import { defineConfig } from "vitepress"

const apps = [
  { text: "Writing an app", link: "/apps/writing-an-app" },
  { text: "Tasks", link: "/apps/tasks" },
  { text: "Chat: OpenAI's API", link: "/apps/chat" },
  { text: "Embeddings", link: "/apps/embeddings" },
  { text: "Speech recognition", link: "/apps/speech-recognition" },
  { text: "Image generation", link: "/apps/images" },
  { text: "Text-to-speech", link: "/apps/text-to-speech" },
  { text: "Audio codes to speech", link: "/apps/codec" },
  { text: "Apps that speak", link: "/apps/speaking" }
]

export default defineConfig({
  title: "Cornserve",
  description: "A serving platform for multimodal ML apps, in one Node.js binary.",
  themeConfig: {
    nav: [
      { text: "Getting started", link: "/getting-started" },
      { text: "Apps", link: "/apps/writing-an-app" },
      { text: "Models", link: "/models" },
      {
        text: "Reference",
        items: [
          { text: "The CLI", link: "/cli" },
          { text: "HTTP API", link: "/http-api" }
        ]
      }
    ],
    sidebar: [
      { text: "Introduction", items: [{ text: "Getting started", link: "/getting-started" }] },
      { text: "Writing apps", items: apps },
      {
        text: "Serving",
        items: [
          { text: "Models", link: "/models" },
          { text: "Running a cluster", link: "/cluster" },
          { text: "Operations and security", link: "/operations" }
        ]
      },
      {
        text: "Reference",
        items: [
          { text: "The CLI", link: "/cli" },
          { text: "HTTP API", link: "/http-api" },
          { text: "Architecture", link: "/architecture" },
          { text: "Development", link: "/development" }
        ]
      }
    ],
    outline: [2, 3],
    search: { provider: "local" }
  }
})
