"""hvg_cinder_driver — the second Cinder backend of the e2e harness ("fakeimg").

python3-cinder's FakeLoggingVolumeDriver keeps volumes only in Cinder's
database, but its image copy is the LVM driver's: qemu-img writing into
/dev/mapper/cinder--volumes-..., which does not exist here, so a volume made
from a glance image ends in status "error". This subclass copies nothing: the
volume becomes "available" and bootable (Cinder still records the image's
metadata on it), which is all Nova's fake-driver computes need for a
boot-from-volume server. Loaded by cinder-volume from the harness directory
(lib.sh puts it on sys.path).
"""
from oslo_log import log as logging

from cinder.tests import fake_driver

LOG = logging.getLogger(__name__)


class ImageFakeDriver(fake_driver.FakeLoggingVolumeDriver):
    """FakeLoggingVolumeDriver whose image copies write nothing."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # the parent reports volume_backend_name "fake" whatever the config
        # says, so a volume type could not tell the two backends apart
        self.backend_name = self.configuration.safe_get('volume_backend_name') or 'fakeimg'

    def copy_image_to_volume(self, context, volume, image_service, image_id):
        LOG.info("hvg fake backend: image %s 'copied' to volume %s (nothing written)",
                 image_id, volume.id)

    def copy_volume_to_image(self, context, volume, image_service, image_meta):
        LOG.info("hvg fake backend: volume %s not uploaded (nothing to read)", volume.id)
