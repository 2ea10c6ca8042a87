//! A model that owns the file its weights live in, so it can be moved, shared and kept for
//! as long as the caller likes (`'static`, `Send`): an engine, a server, a C handle or a
//! Python object hold one of these instead of borrowing a map that must outlive them.

use std::sync::Arc;

use bitnet_gguf::GgufFile;

use crate::{Model, Result};

self_cell::self_cell!(
    struct Cell {
        owner: Arc<GgufFile>,
        #[covariant]
        dependent: Model,
    }
    impl {Debug}
);

/// A [`Model`] together with the opened file it reads (mapped or in memory).
#[derive(Debug)]
pub struct OwnedModel(Cell);

impl OwnedModel {
    /// Bind the model over `file` (see [`Model::load`]).
    pub fn load(file: Arc<GgufFile>) -> Result<Self> {
        Ok(OwnedModel(Cell::try_new(file, |f| Model::load(f))?))
    }

    /// [`OwnedModel::load`] with [`Model::load_releasing`] (the low-memory mode).
    pub fn load_releasing(file: Arc<GgufFile>) -> Result<Self> {
        Ok(OwnedModel(Cell::try_new(file, |f| {
            Model::load_releasing(f)
        })?))
    }

    /// The model.
    pub fn model(&self) -> &Model<'_> {
        self.0.borrow_dependent()
    }

    /// The file the weights come from.
    pub fn file(&self) -> &GgufFile {
        self.0.borrow_owner()
    }

    /// The file, shared.
    pub fn file_arc(&self) -> Arc<GgufFile> {
        Arc::clone(self.0.borrow_owner())
    }

    /// Change the model with access to its file (for example to install a re-encoded LM head
    /// and release the pages of its source).
    pub fn with_model_mut<R>(
        &mut self,
        f: impl for<'a> FnOnce(&'a GgufFile, &mut Model<'a>) -> R,
    ) -> R {
        self.0.with_dependent_mut(|file, model| f(file, model))
    }
}
